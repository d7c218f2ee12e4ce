package daemon_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// waitOOMKill waits until sandbox's cgroup has counted an OOM kill.
func (a *api) waitOOMKill(sandbox string) {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var sb wire.Sandbox
		a.must("GET", "/v1/sandboxes/"+sandbox, nil, 200, &sb)
		if sb.Usage != nil && sb.Usage.OOMKills > 0 {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("sandbox %s: no OOM kill within 60 s (usage %+v)", sandbox, sb.Usage)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOOMKilledOnlyWhenTheCommandIs: a command whose child the kernel
// OOM-killed and that then dies of a SIGKILL from elsewhere is not
// reported oom_killed, whoever sent it: itself (kill -9 $$, the way a
// command could claim an OOM it did not suffer), runnerd's signal,
// terminate's grace, or a kill -9 from the host. The sandbox's counter
// rose in each; only the kernel log naming the command's pid is evidence
// (TestLimitsOOMKillIsHonest: a command the kernel does kill is).
func TestOOMKilledOnlyWhenTheCommandIs(t *testing.T) {
	a, _ := limitsDaemon(t)
	// tail keeps a "line" of /dev/zero that never ends and grows until the
	// kernel kills it; the shell is too small to be chosen.
	const childOOM = "tail /dev/zero; "
	for _, tc := range []struct {
		name string
		argv string
		kill func(t *testing.T, a *api, sandbox string, s wire.Session)
	}{
		{"kill -9 $$ after its child's OOM", childOOM + "kill -9 $$", nil},
		{"signal KILL", childOOM + "sleep 60", func(t *testing.T, a *api, sandbox string, s wire.Session) {
			a.must("POST", "/v1/sandboxes/"+sandbox+"/sessions/"+s.ID+"/signal", wire.Signal{Signal: "KILL"}, 204, nil)
		}},
		{"terminate's grace", "trap '' TERM; " + childOOM + "sleep 60", func(t *testing.T, a *api, sandbox string, s wire.Session) {
			a.must("POST", "/v1/sandboxes/"+sandbox+"/sessions/"+s.ID+"/terminate", wire.Terminate{GraceMS: 200}, 200, nil)
		}},
		{"kill -9 from the host", childOOM + "sleep 60", func(t *testing.T, a *api, sandbox string, s wire.Session) {
			if err := syscall.Kill(s.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &api{t: t, base: a.base, hc: a.hc, token: a.token, state: a.state}
			name := strings.NewReplacer(" ", "-", "$", "", "'", "").Replace(strings.ToLower(tc.name))
			name = strings.Trim(strings.ReplaceAll(name, "--", "-"), "-")
			a.createLimited(name, wire.Limits{MemoryBytes: smallMemory})
			s := a.spawn(name, wire.CreateSession{Argv: []string{"sh", "-c", tc.argv}})
			if tc.kill != nil {
				a.waitOOMKill(name)
				tc.kill(t, a, name, s)
			}
			got := a.waitEndedWithin(name, s.ID, 60*time.Second)
			e := got.Exit
			if e == nil || e.Reason != wire.ExitSignaled || e.Signal != 9 || e.Code != 137 {
				t.Fatalf("exit %+v, want signaled 9 (137)", e)
			}
			if e.OOMKilled {
				t.Errorf("exit %+v: oom_killed, but the OOM killer killed the command's child, not the command", e)
			}
			a.waitOOMKill(name) // the child's kill was counted all the same
		})
	}
}
