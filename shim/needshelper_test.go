package shim

import (
	"os/exec"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestSpecNeedsHelperAgrees: the launcher's Spec.NeedsHelper (which picks
// warm shims with the helper started ahead, without the supervisor's exec
// table) says what execCommand's plan decides, for every step that only
// the helper can do and for the fork-side ones that it cannot.
func TestSpecNeedsHelperAgrees(t *testing.T) {
	shimtest.NeedRoot(t) // cgroups to make, and the isolated user's credential
	for _, tc := range []struct {
		name string
		spec func(t *testing.T) sessiondir.Spec
	}{
		{"plain", func(*testing.T) sessiondir.Spec { return sessiondir.Spec{} }},
		{"netns", func(*testing.T) sessiondir.Spec { return sessiondir.Spec{NetNS: "/proc/self/ns/net"} }},
		{"cwd-root", func(*testing.T) sessiondir.Spec { return sessiondir.Spec{Dir: "/tmp", DirRoot: "/"} }},
		{"resolv-conf", func(*testing.T) sessiondir.Spec { return sessiondir.Spec{ResolvConf: "/etc/hosts"} }},
		{"binds", func(*testing.T) sessiondir.Spec {
			return sessiondir.Spec{Binds: []sessiondir.Bind{{Source: "/tmp", Target: "/mnt"}}}
		}},
		{"hostname", func(*testing.T) sessiondir.Spec { return sessiondir.Spec{Hostname: "h"} }},
		{"isolate", func(*testing.T) sessiondir.Spec { return sessiondir.Spec{User: "nobody", Isolate: true} }},
		{"cgroup-v2", func(t *testing.T) sessiondir.Spec {
			return sessiondir.Spec{Cgroups: dirsOf(makeCgroups(t, false, true))}
		}},
		{"cgroups-v1", func(t *testing.T) sessiondir.Spec {
			return sessiondir.Spec{Cgroups: dirsOf(makeCgroups(t, true, false))}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec(t)
			cmd := exec.Command("true")
			cmd.Dir = spec.Dir
			cmd.SysProcAttr = &syscall.SysProcAttr{}
			if spec.User != "" {
				c, err := sessiondir.Credential(spec.User)
				if err != nil {
					t.Fatal(err)
				}
				cmd.SysProcAttr.Credential = c
			}
			p, err := newExecPlan(cmd, spec)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := spec.NeedsHelper(), p.needsHelper(); got != want {
				t.Errorf("Spec.NeedsHelper() = %v, the exec plan's needsHelper() = %v", got, want)
			}
		})
	}
}
