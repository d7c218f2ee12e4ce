package shim

import (
	"testing"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestIsolateSeccomp: an isolated command runs under the seccomp filter
// (exec.go, step 10), so `unshare -U -r`, the way into a user namespace
// with every capability, fails with EPERM; the same user without Isolate
// gets in (the control that shows the attack works without the filter).
func TestIsolateSeccomp(t *testing.T) {
	shimtest.NeedRoot(t)
	argv := []string{"sh", "-c", "unshare -U -r true 2>&1; echo rc=$?"}
	out, code := runToEnd(t, sessiondir.Spec{Argv: argv, User: "nobody"})
	if code != 0 || out != "rc=0\n" {
		t.Fatalf("control without isolate: exit %d, %q; want rc=0 (unprivileged user namespaces must be on for this test)", code, out)
	}
	out, code = runToEnd(t, sessiondir.Spec{Argv: argv, User: "nobody", Isolate: true})
	if want := "unshare: unshare failed: Operation not permitted\nrc=1\n"; code != 0 || out != want {
		t.Fatalf("isolate: exit %d, %q; want 0 and %q", code, out, want)
	}
}
