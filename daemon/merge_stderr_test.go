package daemon_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// TestSpawnMergeStderr: with merge_stderr the command's stdout and stderr
// are one pipe, so the stdout stream holds both in the order written
// (what `runner exec` relies on when its own stdout and stderr are one
// file) and the stderr stream is empty; a tty with it is refused, and a
// retry of the same id must repeat it.
func TestSpawnMergeStderr(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	script := "for i in 1 2 3; do echo out$i; echo err$i >&2; done"
	a.spawn("box", wire.CreateSession{ID: "m", Argv: []string{"sh", "-c", script}, MergeStderr: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := a.attach(ctx, "box", "m", "", nil)
	if res.terminal == nil || res.exit.Reason != wire.ExitExited || res.exit.Code != 0 {
		t.Fatalf("attach ended with %+v (terminal %v), want exit 0", res.exit, res.terminal)
	}
	if got, want := string(res.streams["stdout"]), "out1\nerr1\nout2\nerr2\nout3\nerr3\n"; got != want {
		t.Errorf("stdout stream: got %q, want %q", got, want)
	}
	if got := res.streams["stderr"]; len(got) != 0 {
		t.Errorf("stderr stream: got %q, want it empty", got)
	}
	if got := res.exit.Lengths["stderr"]; got != 0 {
		t.Errorf("exit lengths[stderr] = %d, want 0", got)
	}

	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions", wire.CreateSession{ID: "t", Argv: []string{"true"}, TTY: true, MergeStderr: true}), 400, wire.CodeInvalid)
	// The same id without the merge is another request: a conflict, never
	// the merged session answered as if it were the one asked for.
	r := a.do("POST", "/v1/sandboxes/box/sessions", wire.CreateSession{ID: "m", Argv: []string{"sh", "-c", script}})
	if r.status != 409 || r.code() != wire.CodeInvalid {
		t.Errorf("respawn of m without merge_stderr: got %d %s, want 409 invalid", r.status, r.body)
	}
}
