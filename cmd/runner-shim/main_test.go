package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestCLI builds runner-shim and drives one session through the shell
// interface: spawn, write, close-stdin, attach (frames and text), status,
// list.
func TestCLI(t *testing.T) {
	c := newCLI(t)
	root := c.root
	// run answers stdout alone on success, stdout then stderr on a
	// failure, so a message is found whichever stream carries it.
	run := func(stdin string, args ...string) (string, int) {
		t.Helper()
		out, errOut, code := c.run(stdin, args...)
		if code != 0 {
			return out + errOut, code
		}
		return out, 0
	}

	id, code := run("", "spawn", "--id", "c1", "--", "sh", "-c", `cat; echo bye >&2; exit 6`)
	if code != 0 || strings.TrimSpace(id) != "c1" {
		t.Fatalf("spawn: got %q %d", id, code)
	}
	if out, code := run("from stdin\n", "write", "c1"); code != 0 {
		t.Fatalf("write: %q %d", out, code)
	}
	if out, code := run("", "write", "c1", "from", "args\n"); code != 0 {
		t.Fatalf("write: %q %d", out, code)
	}
	if out, code := run("", "close-stdin", "c1"); code != 0 {
		t.Fatalf("close-stdin: %q %d", out, code)
	}
	frames, code := run("", "attach", "c1")
	if code != 0 {
		t.Fatalf("attach: %d %q", code, frames)
	}
	d := wire.NewDecoder(strings.NewReader(frames))
	var stdout bytes.Buffer
	var last wire.Frame
	for {
		f, err := d.Next()
		if err != nil {
			break
		}
		if f.Kind == wire.FrameData && f.Stream == wire.StreamStdout {
			stdout.Write(f.Payload)
		}
		last = f
	}
	if stdout.String() != "from stdin\nfrom args\n" {
		t.Fatalf("stdout: got %q", stdout.String())
	}
	if e, err := last.Exit(); err != nil || e.Code != 6 {
		t.Fatalf("last frame: %s %+v %v, want exit 6", last.Kind, e, err)
	}
	if out, code := run("", "attach", "--text", "--stdout", "11", "c1"); code != 6 || out != "from args\nbye\n" {
		t.Fatalf("attach --text from a cursor: got %q %d, want the rest and status 6", out, code)
	}
	out, code := run("", "status", "c1")
	var st struct {
		State string
		Exit  struct{ Code int }
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.State != "exited" || st.Exit.Code != 6 {
		t.Fatalf("status: %q %d", out, code)
	}
	if out, code := run("", "list"); code != 0 || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"id":"c1"`) {
		t.Fatalf("list: %q %d", out, code)
	}
	if _, code := run("", "write", "c1", "late"); code != 3 {
		t.Fatalf("write after exit: got status %d, want 3", code)
	}
	if out, code := run("", "spawn", "--id", "c2", "--", "/no/such/binary"); code != wire.ShimExitExecNotFound || !strings.Contains(out, "no such file") {
		t.Fatalf("spawn of a missing binary: got %q %d", out, code)
	}
	if _, err := os.Stat(filepath.Join(root, "c2")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed spawn left %s/c2 behind", root)
	}
}
