package cli

import (
	"strings"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestForkCommand: runner fork SRC NEW gives NEW SRC's files now, runner
// fork --checkpoint ID a checkpoint's, with NEW's own limits; an unknown
// source is not_found (its exit code) and a name that exists invalid,
// each with nothing made.
func TestForkCommand(t *testing.T) {
	d := checkpointRunnerd(t)
	d.sandbox(t, "fk-src")
	d.ok(t, "exec", "fk-src", "--", "sh", "-c", "printf 'a\\000b' > f")
	ck := strings.TrimSpace(d.ok(t, "checkpoint", "fk-src"))
	d.ok(t, "exec", "fk-src", "--", "sh", "-c", "printf later > f")

	t.Cleanup(func() { runCLIEnv(d.env(), nil, "rm", "fk-now", "fk-ck") })
	out := d.ok(t, "fork", "fk-src", "fk-now", "--pids", "64")
	if !strings.HasPrefix(out, "fk-now running (workspace ") || !strings.Contains(out, "forked from fk-src's disk now") || !strings.Contains(out, "pids 64") {
		t.Errorf("runner fork printed %q", out)
	}
	if got := d.ok(t, "exec", "fk-now", "--", "cat", "f"); got != "later" {
		t.Errorf("the fork of now reads %q, want %q", got, "later")
	}
	sb := decode[wire.Sandbox](t, d.ok(t, "fork", "fk-src", "fk-ck", "--checkpoint", ck, "--json"))
	if sb.Name != "fk-ck" || sb.State != wire.SandboxRunning {
		t.Errorf("runner fork --json = %+v", sb)
	}
	if got := d.ok(t, "exec", "fk-ck", "--", "cat", "f"); got != "a\x00b" {
		t.Errorf("the fork of %s reads %q, want the checkpoint's", ck, got)
	}

	_, e, code := d.cli(t, nil, "fork", "fk-nosuch", "fk-x")
	if code != wire.RunnerExitNotFound || !strings.Contains(e, "not_found") {
		t.Errorf("fork of an unknown source: exit %d, stderr %q; want %d not_found", code, e, wire.RunnerExitNotFound)
	}
	_, e, code = d.cli(t, nil, "fork", "fk-src", "fk-now")
	if code != wire.RunnerExitInvalid || !strings.Contains(e, "exists") {
		t.Errorf("fork to an existing name: exit %d, stderr %q; want %d", code, e, wire.RunnerExitInvalid)
	}
	if _, _, code := d.cli(t, nil, "get", "fk-x"); code != wire.RunnerExitNotFound {
		t.Errorf("a refused fork made fk-x (get exit %d)", code)
	}
	if _, _, code := d.cli(t, nil, "fork", "fk-src"); code != 2 {
		t.Errorf("fork with one argument: exit %d, want 2 (usage)", code)
	}
}
