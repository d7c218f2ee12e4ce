package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// tmux is a tmux server of its own (its own socket in a temp dir), so the
// test never touches a person's tmux.
type tmux struct {
	t    *testing.T
	sock string
	env  []string
}

func (x *tmux) run(args ...string) string {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "tmux", append([]string{"-S", x.sock}, args...)...)
	cmd.Env = x.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		x.t.Fatalf("tmux %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// pane returns the visible pane, wrapped lines joined.
func (x *tmux) pane() string {
	x.t.Helper()
	return x.run("capture-pane", "-p", "-J", "-t", "t")
}

// waitPane polls the pane until match finds something, with a deadline.
func (x *tmux) waitPane(what string, match func(string) bool) string {
	x.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		p := x.pane()
		if match(p) {
			return p
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("waiting for %s: pane is:\n%s", what, p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (x *tmux) waitFor(s string) string {
	x.t.Helper()
	return x.waitPane(fmt.Sprintf("%q", s), func(p string) bool { return strings.Contains(p, s) })
}

// keys types literal text, then presses Enter.
func (x *tmux) line(s string) {
	x.t.Helper()
	x.run("send-keys", "-t", "t", "-l", s)
	x.run("send-keys", "-t", "t", "Enter")
}

// waitFile polls a file until it has content.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v %q", path, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var cursorRe = regexp.MustCompile(`--cursor (\d+)`)

// TestAttachTmux drives `runner attach` on a real PTY session from a real
// terminal: tmux runs a shell in which the test types like a person.
func TestAttachTmux(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "tmux-box")
	dir := t.TempDir()

	// A PTY shell in the sandbox, started by a script (24x80 by default).
	d.ok(t, "spawn", box, "--tty", "--id", "sh1", "--env", "PS1=in$ ", "--", "sh")

	x := newTmux(t, d)

	exit1, exit2 := filepath.Join(dir, "exit1"), filepath.Join(dir, "exit2")
	x.line(fmt.Sprintf("runner attach %s sh1; echo EXIT=$? > %s", box, exit1))
	x.waitFor("in$ ")

	// Type; the shell in the session echoes and runs it. The expected
	// output differs from what was typed, so it is the command's.
	x.line("echo typed-$((6*7))")
	x.waitFor("typed-42")
	// Attach made the session follow this terminal's size.
	x.line("stty size")
	x.waitFor("40 120")

	// Detach: Ctrl-]. runner exits and says how to reattach.
	x.run("send-keys", "-t", "t", "C-]")
	p := x.waitFor("reattach with:")
	if got := waitFile(t, exit1); got != fmt.Sprintf("EXIT=%d", exitDetached) {
		t.Errorf("runner attach after detach: %s, want EXIT=%d", got, exitDetached)
	}
	m := cursorRe.FindStringSubmatch(p)
	if m == nil {
		t.Fatalf("detach message names no cursor:\n%s", p)
	}
	x.waitFor("host$ ")

	// The session still runs.
	if s := decode[wire.Session](t, d.ok(t, "sessions", box, "sh1", "--json")); s.State != wire.SessionRunning {
		t.Fatalf("after detach: session is %s, want running", s.State)
	}
	// It produces output while nobody is attached.
	d.ok(t, "write", box, "sh1", "echo missed-$((40+2))")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.ok(t, "logs", box, "sh1"), "missed-42") {
		if time.Now().After(deadline) {
			t.Fatal("the session did not run the command written while detached")
		}
		time.Sleep(50 * time.Millisecond)
	}
	x.line("clear")
	x.waitPane("a cleared pane", func(p string) bool { return !strings.Contains(p, "typed-42") })
	if strings.Contains(x.pane(), "missed-42") {
		t.Fatal("missed output on the pane before reattaching")
	}

	// Reattach from the cursor the detach message gave: the missed output
	// appears, and what was already seen does not.
	x.line(fmt.Sprintf("runner attach %s sh1 --cursor %s; echo EXIT=$? > %s", box, m[1], exit2))
	p = x.waitFor("missed-42")
	if strings.Contains(p, "typed-42") {
		t.Errorf("reattach from the cursor replayed output seen before:\n%s", p)
	}

	// Resize the terminal: the session follows (SIGWINCH).
	x.run("resize-window", "-t", "t", "-x", "100", "-y", "30")
	x.waitPane("a 100x30 pane", func(string) bool {
		return strings.TrimSpace(x.run("display-message", "-p", "-t", "t", "#{pane_width}x#{pane_height}")) == "100x30"
	})
	x.line("clear; stty size")
	x.waitFor("30 100")

	// End the command: runner exits with its code.
	x.line("exit 7")
	if got := waitFile(t, exit2); got != "EXIT=7" {
		t.Errorf("runner attach after `exit 7`: %s, want EXIT=7", got)
	}
	if s := decode[wire.Session](t, d.ok(t, "sessions", box, "sh1", "--json")); s.Exit == nil || s.Exit.Code != 7 {
		t.Errorf("session after exit 7: %+v", s)
	}
	// The terminal was restored: the pane's shell echoes what is typed.
	x.line("echo back-$((1+1))")
	x.waitFor("back-2")
}
