package daemon_test

import (
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/testcap"
)

// TestIsolatedCommandSeccomp: a command in a contained sandbox of a real
// runnerd runs under the seccomp filter (Seccomp: 2 in its status) and
// cannot enter a user namespace with `unshare -U -r`, the way to full
// capabilities over a kernel attack surface. The control, an uncontained
// sandbox of a runnerd under --isolate none, has no filter and gets in.
func TestIsolatedCommandSeccomp(t *testing.T) {
	testcap.Root(t, "contained sandboxes need a root runnerd")
	script := "grep '^Seccomp:' /proc/self/status; unshare -U -r true 2>&1; echo rc=$?"

	plain := startDaemonCfg(t, daemon.Config{StateDir: passableTempDir(t), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		Isolate: daemon.IsolateNone})
	if sb := plain.createSandbox("plain"); sb.Isolated {
		t.Fatalf("control sandbox is isolated")
	}
	if got, want := plain.run("plain", "sh", "-c", script), "Seccomp:\t0\nrc=0"; got != want {
		t.Fatalf("uncontained control: got %q, want %q", got, want)
	}

	first, last := testIdentityRange(1)
	a := startDaemonCfg(t, daemon.Config{StateDir: passableTempDir(t), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		Isolate: daemon.IsolateAll, IdentityFirst: first, IdentityLast: last})
	if sb := a.createSandbox("filtered"); !sb.Isolated {
		t.Fatalf("sandbox under --isolate all is not isolated")
	}
	want := "Seccomp:\t2\nunshare: unshare failed: Operation not permitted\nrc=1"
	if got := a.run("filtered", "sh", "-c", script); got != want {
		t.Errorf("contained sandbox: got %q, want %q", got, want)
	}
}
