package shim

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestCommandEnvNoShimGOMAXPROCS: shims (and the nsexec helpers they
// start) run with GOMAXPROCS=1 in their environment (launch.shimEnv);
// the command gets Spec.Env and nothing else on every exec path (direct,
// the helper for Isolate, the helper in a pod): no GOMAXPROCS unless the
// caller set one, and then the caller's value.
func TestCommandEnvNoShimGOMAXPROCS(t *testing.T) {
	shimtest.NeedRoot(t)
	// The shell's own environment as execve(2) gave it.
	// Absolute paths: one case has no PATH at all.
	const script = `/usr/bin/tr '\0' '\n' </proc/$$/environ`
	var p *testPod
	for _, path := range []struct {
		name string
		spec func(env []string) sessiondir.Spec
	}{
		{"direct", func(env []string) sessiondir.Spec {
			return sessiondir.Spec{Argv: []string{"/bin/sh", "-c", script}, Env: env}
		}},
		{"helper", func(env []string) sessiondir.Spec {
			return sessiondir.Spec{Argv: []string{"/bin/sh", "-c", script}, Env: env, User: "nobody", Isolate: true}
		}},
		{"pod", func(env []string) sessiondir.Spec {
			if p == nil {
				p = newPod(t, "gomaxprocs", 14)
			}
			return sessiondir.Spec{Argv: []string{"/bin/sh", "-c", script}, Env: env, Pod: p.ref(), Dir: pod.WorkspacePath}
		}},
	} {
		// {}: a caller that gave no environment at all.
		for _, env := range [][]string{nil, {}, {"PATH=/usr/bin:/bin", "A=1"}, {"PATH=/usr/bin:/bin", "GOMAXPROCS=3"}} {
			t.Run(fmt.Sprintf("%s %#v", path.name, env), func(t *testing.T) {
				dir, st := shimtest.Start(t, path.spec(env))
				shimEnv, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", st.ShimPID))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains("\x00"+string(shimEnv), "\x00GOMAXPROCS=1\x00") {
					t.Errorf("shim %d: environment lacks GOMAXPROCS=1", st.ShimPID)
				}
				if e := shimtest.WaitExit(t, dir); e.Code != 0 {
					t.Fatalf("exit %+v, want 0", e)
				}
				if env == nil {
					env = shimtest.TestEnv // what shimtest.Start gives a spec without one
				}
				want := strings.Join(env, "\n")
				if len(env) > 0 {
					want += "\n"
				}
				if got := shimtest.StdoutOf(t, dir); got != want {
					t.Errorf("command's environment: got %q, want %q", got, want)
				}
			})
		}
	}
}
