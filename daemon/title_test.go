package daemon_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestShimProcessTitle: a real session's shim names its sandbox and
// session in /proc/PID/cmdline (what ps shows) and in comm (what top and
// pgrep match), whether a warm shim took the session (it learnt them
// after it started) or one was started for it.
func TestShimProcessTitle(t *testing.T) {
	for _, c := range []struct {
		name string
		warm int
	}{
		{"warm", 2},
		{"cold", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, WarmShims: c.warm})
			a.createSandbox("title-box")
			var warm []int
			if c.warm > 0 {
				// The warm shims, titled while idle: the spawn must take one.
				deadline := time.Now().Add(20 * time.Second)
				for warm = warmShims(t, a.state); len(warm) < c.warm; warm = warmShims(t, a.state) {
					if time.Now().After(deadline) {
						t.Fatalf("found %d idle warm shims titled \"runner-shim warm\", want %d", len(warm), c.warm)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			id := "sess-" + c.name
			ss := a.spawn("title-box", wire.CreateSession{ID: id, Argv: []string{"sleep", "60"}})
			shimPID := parentPID(t, ss.PID)
			if c.warm > 0 && !slices.Contains(warm, shimPID) {
				t.Fatalf("shim %d is not one of the warm shims %v", shimPID, warm)
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", shimPID))
			if err != nil {
				t.Fatal(err)
			}
			if want := "runner-shim sandbox=title-box session=" + id + "\x00"; string(cmdline) != want {
				t.Errorf("shim %d cmdline %q, want %q", shimPID, cmdline, want)
			}
			comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", shimPID))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(bytes.TrimSuffix(comm, []byte("\n"))); got != "shim title-box" {
				t.Errorf("shim %d comm %q, want %q", shimPID, got, "shim title-box")
			}
			// The shim still serves its session: it was not disturbed.
			a.must("POST", "/v1/sandboxes/title-box/sessions/"+id+"/terminate", nil, 200, nil)
			if t.Failed() {
				t.Log(strings.ReplaceAll(string(cmdline), "\x00", "|"))
			}
		})
	}
}

// warmShims returns the pids of the processes titled "runner-shim warm"
// that hold a file in state: the idle warm shims of this test's daemon.
func warmShims(t *testing.T, state string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || string(cl) != "runner-shim warm\x00" {
			continue
		}
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
		for _, fd := range fds {
			if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, state+"/") {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
