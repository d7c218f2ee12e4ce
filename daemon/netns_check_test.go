package daemon_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/logsink"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// syncBuffer is a log sink tests read while the daemon writes.
type syncBuffer = logsink.Buffer

// startNetDaemon runs daemon.Run in this process with network
// containment against a lab of its own.
func startNetDaemon(t *testing.T, state string, log *slog.Logger) *api {
	t.Helper()
	return startNetDaemonLab(t, netlab.New(t), state, log)
}

// startNetDaemonLab is startNetDaemon against lab, for a test that looks
// at (or changes) the lab's kernel state itself.
func startNetDaemonLab(t *testing.T, lab *netlab.Lab, state string, log *slog.Logger) *api {
	t.Helper()
	netState := netStateDir(t)
	return startDaemonCfg(t, daemon.Config{
		StateDir: state, Token: testToken,
		NetPolicyState: netState, NetPolicyPool: netlab.Pool, NetPolicyHostNetNS: lab.HostNetNS,
		DNSUpstream: []netip.AddrPort{netip.AddrPortFrom(netlab.C, 53)},
		Logger:      log,
	})
}

// TestNetNSCheckAfterExit: a command of a contained sandbox that has
// already ended when runnerd checks its namespace is not an escape: its
// spawn is answered with the session (201) and its exit, and nothing is
// logged at ERROR. The check is made to run after the command ended (the
// race that 3 spawns in 10,000 lose) and answers as the kernel does then:
// ESRCH for an exiting pid, or "not in the namespace" for a pid the
// kernel has given to another process.
func TestNetNSCheckAfterExit(t *testing.T) {
	var logs syncBuffer
	state := passableTempDir(t)
	a := startNetDaemon(t, state, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "boxed", Network: &wire.Network{Allow: []string{}}}, 200, nil)
	for _, tc := range []struct {
		name   string
		answer func(pid int) (bool, error)
	}{
		{"exiting pid", func(pid int) (bool, error) {
			return false, fmt.Errorf("stat netns of pid %d: %w", pid, unix.ESRCH)
		}},
		{"pid reused", func(int) (bool, error) { return false, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := strings.ReplaceAll(tc.name, " ", "-")
			defer daemon.SetNetNSCheck(func(pid int, path string) (bool, error) {
				// Run the check only once the shim has the command's exit.
				deadline := time.Now().Add(10 * time.Second)
				for time.Now().Before(deadline) {
					if exitedSession(state, id) {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				return tc.answer(pid)
			})()
			r := a.do("POST", "/v1/sandboxes/boxed/sessions", wire.CreateSession{ID: id, Argv: []string{"sh", "-c", "exit 7"}})
			if r.status != http.StatusCreated {
				t.Fatalf("spawn of a command that ended before the check: %d %s, want 201", r.status, r.body)
			}
			var s wire.Session
			a.must("GET", "/v1/sandboxes/boxed/sessions/"+id, nil, 200, &s)
			if s.Exit == nil || s.Exit.Reason != "exited" || s.Exit.Code != 7 {
				t.Errorf("session %+v, want exited 7", s)
			}
			if l := logs.String(); strings.Contains(l, "level=ERROR") {
				t.Errorf("an ended command was logged as an error:\n%s", l)
			}
		})
	}
}

// exitedSession reports whether a shim under state has written the exit
// record of session id.
func exitedSession(state, id string) bool {
	dirs, _ := filepath.Glob(filepath.Join(state, "s", "*"))
	for _, d := range dirs {
		if st, err := sessiondir.ReadStatus(d); err == nil && st.ID == id {
			return st.State == sessiondir.StateExited
		}
	}
	return false
}
