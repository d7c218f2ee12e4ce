package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
)

// The tests of issue #25's CLI items, each against a real runnerd.

// newTmux starts a tmux server of its own with a shell that finds d, and
// stops it at the end.
func newTmux(t *testing.T, d *daemon) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		testcap.Skip(t, "tmux", "drives runner from a real terminal: "+err.Error())
	}
	x := &tmux{t: t, sock: filepath.Join(t.TempDir(), "sock"), env: cliEnv()}
	shell := fmt.Sprintf("env PATH=%s:/usr/bin:/bin RUNNERD_STATE=%s GORACE=atexit_sleep_ms=0 PS1='host$ ' sh", binDir, d.state)
	x.run("new-session", "-d", "-s", "t", "-x", "120", "-y", "40", shell)
	t.Cleanup(func() {
		cmd := exec.Command("tmux", "-S", x.sock, "kill-server")
		cmd.Env = x.env
		_ = cmd.Run()
	})
	x.waitFor("host$ ")
	return x
}

// TestExecStreamsLiveTmux (item 1): exec prints each line as the command
// writes it. The pane is read at intervals while the command still runs:
// after the first tick and before the last, the pane has the first ticks
// and not the last (a buffered exec showed nothing until the end).
func TestExecStreamsLiveTmux(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "live-box")
	x := newTmux(t, d)
	exitFile := filepath.Join(t.TempDir(), "exit")
	x.line(fmt.Sprintf("runner exec %s -- sh -c 'for i in 1 2 3 4 5; do echo tick-$i; sleep 1; done; exit 3'; echo EXIT=$? > %s", box, exitFile))
	start := time.Now()
	x.waitFor("tick-1")
	if p := x.pane(); strings.Contains(p, "tick-5") {
		t.Fatalf("tick-5 on the pane with tick-1, after %s:\n%s", time.Since(start), p)
	}
	p := x.waitFor("tick-2")
	if _, err := os.Stat(exitFile); strings.Contains(p, "tick-5") || err == nil {
		t.Fatalf("at tick-2 the command had already ended:\n%s", p)
	}
	if got := waitFile(t, exitFile); got != "EXIT=3" {
		t.Errorf("exec: %s, want EXIT=3", got)
	}
	if p := x.pane(); !strings.Contains(p, "tick-1\ntick-2\ntick-3\ntick-4\ntick-5\n") {
		t.Errorf("pane lacks the five ticks in order:\n%s", p)
	}
}

// TestExecOrder (item 1): with 2>&1 (runner's stdout and stderr one
// pipe) the lines come in the order the command wrote them, every time;
// with two pipes each stream keeps its own order.
func TestExecOrder(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "order-box")
	script := "echo 1; echo 2 >&2; echo 3; echo 4 >&2; echo 5; echo 6 >&2; exit 4"
	for i := range 5 {
		cmd := exec.Command(filepath.Join(binDir, "runner"), "exec", box, "--", "sh", "-c", script)
		cmd.Env = d.env()
		var both bytes.Buffer
		cmd.Stdout, cmd.Stderr = &both, &both // os/exec gives one pipe for both
		_ = cmd.Run()
		if got, want := both.String(), "1\n2\n3\n4\n5\n6\n"; got != want || cmd.ProcessState.ExitCode() != 4 {
			t.Fatalf("run %d, 2>&1: got %q exit %d, want %q exit 4", i, got, cmd.ProcessState.ExitCode(), want)
		}
	}
	out, errOut, code := d.cli(t, nil, "exec", box, "--", "sh", "-c", script)
	if out != "1\n3\n5\n" || errOut != "2\n4\n6\n" || code != 4 {
		t.Errorf("two pipes: stdout %q stderr %q exit %d; want 1 3 5, 2 4 6, exit 4", out, errOut, code)
	}
}

// TestExecNoCut (item 2): 20 MB of output all arrive (the buffered exec
// cut at 16 MiB and exited 0), and the exit code is the command's.
func TestExecNoCut(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "big-box")
	cmd := exec.Command(filepath.Join(binDir, "runner"), "exec", box, "--", "sh", "-c", "head -c 20000000 /dev/zero; exit 5")
	cmd.Env = d.env()
	var n countWriter
	var errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &n, &errOut
	_ = cmd.Run()
	if n != 20000000 || cmd.ProcessState.ExitCode() != 5 || errOut.Len() != 0 {
		t.Errorf("exec of 20000000 bytes: got %d bytes, exit %d, stderr %q; want all of them, exit 5, no stderr", n, cmd.ProcessState.ExitCode(), errOut.String())
	}
	// Stdin of any size streams too (one exec request held at most
	// about 768 KiB of it).
	in := bytes.Repeat([]byte("x"), 3<<20)
	o, e, code := d.cli(t, in, "exec", box, "-i", "--", "wc", "-c")
	if strings.TrimSpace(o) != fmt.Sprint(len(in)) || code != 0 {
		t.Errorf("exec -i of %d bytes: stdout %q stderr %q exit %d", len(in), o, e, code)
	}
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// TestExecInteractiveTmux (item 3): -it makes the terminal the
// command's (a tty, its size, keys as typed, its exit code); -i alone
// streams stdin as typed (cat answers each line while it runs); run
// creates the sandbox and, with --id, attaches to the same shell again.
func TestExecInteractiveTmux(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "it-box")
	x := newTmux(t, d)
	dir := t.TempDir()

	exit1 := filepath.Join(dir, "exit1")
	x.line(fmt.Sprintf("runner exec -it %s --env 'PS1=in$ ' -- sh; echo EXIT=$? > %s", box, exit1))
	x.waitFor("in$ ")
	x.line("tty; stty size; echo typed-$((6*7))")
	p := x.waitFor("typed-42")
	if !strings.Contains(p, "/dev/pts/") || !strings.Contains(p, "40 120") {
		t.Errorf("exec -it: want a terminal of 40x120:\n%s", p)
	}
	x.line("exit 6")
	if got := waitFile(t, exit1); got != "EXIT=6" {
		t.Errorf("exec -it after exit 6: %s", got)
	}

	// -i: each line reaches cat as typed, and cat's answer comes back
	// while runner still waits; ^D is the EOF.
	exit2 := filepath.Join(dir, "exit2")
	x.run("send-keys", "-t", "t", "clear", "Enter")
	x.line(fmt.Sprintf("runner exec -i %s -- sed -u s/^/got-/; echo EXIT=$? > %s", box, exit2))
	time.Sleep(300 * time.Millisecond)
	x.line("first")
	x.waitFor("got-first")
	x.line("second")
	x.waitFor("got-second")
	if _, err := os.Stat(exit2); err == nil {
		t.Fatal("exec -i ended before its stdin did")
	}
	x.run("send-keys", "-t", "t", "C-d")
	if got := waitFile(t, exit2); got != "EXIT=0" {
		t.Errorf("exec -i after ^D: %s", got)
	}

	// run: create if missing, then attach; the same --id attaches again.
	runBox := "run-box"
	t.Cleanup(func() { runCLIEnv(d.env(), nil, "rm", runBox) })
	exit3, exit4 := filepath.Join(dir, "exit3"), filepath.Join(dir, "exit4")
	x.run("send-keys", "-t", "t", "clear", "Enter")
	x.line(fmt.Sprintf("runner run %s --id sh --env 'PS1=run$ ' -- sh; echo EXIT=$? > %s", runBox, exit3))
	x.waitFor("run$ ")
	x.line("echo first-$((1+1))")
	x.waitFor("first-2")
	x.run("send-keys", "-t", "t", "C-]")
	if got := waitFile(t, exit3); got != fmt.Sprintf("EXIT=%d", exitDetached) {
		t.Errorf("run after the detach key: %s, want EXIT=%d", got, exitDetached)
	}
	x.run("send-keys", "-t", "t", "clear", "Enter")
	x.waitPane("a cleared pane", func(p string) bool { return !strings.Contains(p, "first-2") })
	x.line(fmt.Sprintf("runner run %s --id sh --env 'PS1=run$ ' -- sh; echo EXIT=$? > %s", runBox, exit4))
	x.waitFor("first-2") // the same shell: its output replayed
	x.line("exit 9")
	if got := waitFile(t, exit4); got != "EXIT=9" {
		t.Errorf("second run after exit 9: %s", got)
	}
}
