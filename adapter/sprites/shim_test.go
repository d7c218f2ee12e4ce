package sprites_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// TestRealRunnerShim installs the real runner-shim the way the adapter
// will (fs/write, mode 0755, parents created) and drives a session through
// the exec WebSocket: spawn, write, close-stdin, attach --text. The bytes
// (a NUL included) and the exit code 3 cross the stand-in's real
// processes and the one-byte exit field.
func TestRealRunnerShim(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	root := installShim(t, f, "shim")
	ctx := ctxFor(t)
	run := func(stdin []byte, args ...string) sprites.Result {
		t.Helper()
		r, err := f.c.Run(ctx, "shim", sprites.ExecOptions{Argv: append([]string{shimPath, "--root", root}, args...)}, stdin)
		if err != nil {
			t.Fatalf("runner-shim %v: %v", args, err)
		}
		return r
	}
	spawn := run(nil, "spawn", "--", "/bin/sh", "-c", `printf 'a\000b'; read x; echo "in:$x"; exit 3`)
	id := strings.TrimSpace(string(spawn.Stdout))
	if spawn.ExitCode != 0 || id == "" {
		t.Fatalf("spawn: exit %d stdout %q stderr %q", spawn.ExitCode, spawn.Stdout, spawn.Stderr)
	}
	t.Cleanup(func() {
		_, _ = f.c.Run(ctxFor(t), "shim", sprites.ExecOptions{Argv: []string{shimPath, "--root", root, "terminate", "--grace", "1s", id}}, nil)
	})
	if r := run(nil, "write", id, "hello"); r.ExitCode != 0 {
		t.Fatalf("write: exit %d %q", r.ExitCode, r.Stderr)
	}
	if r := run(nil, "close-stdin", id); r.ExitCode != 0 {
		t.Fatalf("close-stdin: exit %d %q", r.ExitCode, r.Stderr)
	}
	att := run(nil, "attach", "--text", id)
	if string(att.Stdout) != "a\x00bin:hello\n" || att.ExitCode != 3 {
		t.Errorf("attach --text: stdout %q exit %d (stderr %q); want %q and 3", att.Stdout, att.ExitCode, att.Stderr, "a\x00bin:hello\n")
	}
}

// shimPath is where the tests install runner-shim in a sprite.
const shimPath = "/home/sprite/.local/bin/runner-shim"

// installShim creates the sprite name, uploads the real runner-shim
// (built by TestMain) to shimPath with fs/write, mode 0755, and returns a
// --root for it inside the sprite's directory.
func installShim(t *testing.T, f fixture, name string) string {
	t.Helper()
	if shims.Err != nil {
		t.Fatal(shims.Err)
	}
	data, err := os.ReadFile(shims.Current)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, f, name)
	if _, err := f.c.WriteFile(ctxFor(t), name, shimPath, data, 0o755); err != nil {
		t.Fatalf("install runner-shim: %v", err)
	}
	dir, _ := f.srv.Dir(name)
	return filepath.Join(dir, "s") // short: ctl.sock must fit in 107 bytes
}
