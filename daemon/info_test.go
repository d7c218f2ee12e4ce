package daemon_test

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestInfo: GET /v1/info says what this runnerd is and holds, each field
// read from what it set up: the version, the capabilities (the same list
// as /v1/capabilities), the capacity counts, the state directory, the
// cgroup and isolation modes in force, and the warm pool.
func TestInfo(t *testing.T) {
	state := t.TempDir()
	cases := []struct {
		name    string
		cfg     daemon.Config
		cgroups func(string) bool
	}{
		{"cgroups off", daemon.Config{Cgroups: daemon.CgroupsOff, WarmShims: 2}, func(m string) bool { return m == "off" }},
		{"cgroups auto", daemon.Config{WarmShims: -1}, func(m string) bool { return m == "v1" || m == "v2" || m == "off" }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.StateDir, cfg.Token, cfg.NetPolicy = state+"/"+string(rune('a'+i)), testToken, daemon.NetPolicyOff
			a := startDaemonCfg(t, cfg)
			a.createSandbox("one")
			a.createSandbox("two")
			a.spawn("one", wire.CreateSession{ID: "s", Argv: []string{"sleep", "30"}})
			var caps wire.Capabilities
			a.must("GET", "/v1/capabilities", nil, 200, &caps)

			var info wire.Info
			a.must("GET", "/v1/info", nil, 200, &info)
			var h wire.Health
			a.must("GET", "/healthz", nil, 200, &h)
			if info.Version != h.Version || info.StateDir != cfg.StateDir {
				t.Errorf("version %q state %q, want /healthz's %q and %q", info.Version, info.StateDir, h.Version, cfg.StateDir)
			}
			if !slices.Equal(info.Capabilities, caps.Capabilities) {
				t.Errorf("capabilities %v, want /v1/capabilities' %v", info.Capabilities, caps.Capabilities)
			}
			if info.Capacity.Sandboxes != 2 || info.Capacity.Sessions != 1 {
				t.Errorf("capacity: %d sandboxes %d sessions, want 2 and 1", info.Capacity.Sandboxes, info.Capacity.Sessions)
			}
			limits := slices.Contains(caps.Capabilities, wire.CapResourceLimits)
			if !tc.cgroups(info.Cgroups) || (info.Cgroups == "off") == limits || (info.CgroupRoot == "") != (info.Cgroups == "off") {
				t.Errorf("cgroups %q root %q with resource_limits %v", info.Cgroups, info.CgroupRoot, limits)
			}
			wantIso := "off"
			if os.Geteuid() == 0 {
				wantIso = rootDefaultIsolation() // the default --isolate as root
			}
			if info.Isolation != wantIso {
				t.Errorf("isolation %q, want %q", info.Isolation, wantIso)
			}
			if cfg.WarmShims > 0 {
				deadline := time.Now().Add(10 * time.Second)
				for info.WarmShims.Idle != cfg.WarmShims && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
					a.must("GET", "/v1/info", nil, 200, &info)
				}
				if info.WarmShims != (wire.WarmShims{Target: cfg.WarmShims, Idle: cfg.WarmShims}) {
					t.Errorf("warm shims %+v, want target and idle %d", info.WarmShims, cfg.WarmShims)
				}
			} else if info.WarmShims != (wire.WarmShims{}) {
				t.Errorf("warm shims %+v with the pool off, want zero", info.WarmShims)
			}
			// Authenticated like every /v1 route.
			good := a.token
			a.token = "wrong"
			r := a.do("GET", "/v1/info", nil)
			a.token = good
			if r.status != 401 || strings.Contains(string(r.body), cfg.StateDir) {
				t.Errorf("GET /v1/info with a wrong token: %d %s", r.status, r.body)
			}
		})
	}
}
