package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// pidFrom waits for a file holding one decimal pid (written by a test
// script) and registers a cleanup that SIGKILLs that process if it is
// still a child of no one but the shim's tree (so a failing test never
// leaves it running).
func pidFrom(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(path)
		if s := strings.TrimSpace(string(b)); err == nil && strings.HasSuffix(string(b), "\n") && s != "" {
			pid, err := strconv.Atoi(s)
			if err != nil {
				t.Fatalf("%s: %q", path, b)
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) }) // a process this test started
			return pid
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

// gone reports whether pid has no /proc entry: it exited and was reaped
// (a zombie still has one).
func gone(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return errors.Is(err, os.ErrNotExist)
}

// waitReaped waits until pid is gone, failing if it stays a zombie (or
// alive) for longer than d.
func waitReaped(t *testing.T, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: state %q after %v, want reaped (no /proc entry)", pid, processState(pid), d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// orphanScript starts, through an intermediate shell that exits at once
// (a double fork), setsid'd background processes with no hold on the
// session's output, writes their pids to the named files, and exits 0.
// $1: a short sleeper's pid file; $2: a long sleeper's.
const orphanScript = `sh -c 'setsid sleep 0.3 </dev/null >/dev/null 2>&1 & echo $! >"$1"
setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! >"$2"' x "$1" "$2"; exit 0`

// TestLingeringDescendants: a command that leaves setsid'd, double-forked
// processes behind and exits 0 gets its exit record at once; the shim
// adopts them (subreaper), reaps the one that exits on its own (no
// zombie), stays alive reporting the other as a descendant, and a
// terminate kills it, answers the unchanged record, after which the shim
// exits.
func TestLingeringDescendants(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	short, long := filepath.Join(tmp, "short"), filepath.Join(tmp, "long")
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", orphanScript, "sh", short, long}})
	e := shimtest.WaitExit(t, dir)
	if took := time.Since(st.StartedAt); took > DrainGrace/2 {
		t.Errorf("exit record after %v, want at once (no output is held)", took)
	}
	if e.Reason != journal.ReasonExited || e.Code != 0 || e.Terminated {
		t.Fatalf("exit: got %+v, want exited 0", e)
	}
	shortPID, longPID := pidFrom(t, short), pidFrom(t, long)
	waitReaped(t, st.PID, 2*time.Second) // the command itself

	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 15*time.Second)
	if got := shimtest.ParentOf(t, longPID); got != st.ShimPID {
		t.Errorf("orphan %d: parent %d, want the shim %d", longPID, got, st.ShimPID)
	}
	// The short one exits on its own while the shim lingers: reaped by
	// the shim, never left a zombie.
	waitReaped(t, shortPID, 3*time.Second)
	s := waitStatus(t, c, "one descendant", func(s sessiondir.Status) bool { return s.Descendants == 1 })
	if s.State != sessiondir.StateExited || s.Exit == nil || s.Exit.Code != 0 {
		t.Fatalf("status while lingering: got %+v, want exited 0", s)
	}
	if err := c.WriteStdin(ctx, []byte("x")); !errors.Is(err, sessiondir.ErrExited) {
		t.Fatalf("stdin while lingering: got %v, want ErrExited", err)
	}
	if err := syscall.Kill(st.ShimPID, 0); err != nil {
		t.Fatalf("shim gone while a descendant lives: %v", err)
	}

	t0 := time.Now()
	got, err := c.Terminate(ctx, 2*time.Second)
	if err != nil || got.Reason != journal.ReasonExited || got.Code != 0 || got.Terminated {
		t.Fatalf("terminate: got %+v %v, want the record exited 0, not terminated", got, err)
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("terminate took %v; sleep dies of SIGTERM at once", took)
	}
	waitReaped(t, longPID, time.Second)
	shimtest.WaitGone(t, st.ShimPID)
	if _, err := os.Stat(filepath.Join(dir, sessiondir.SocketFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ctl.sock after the shim exited: %v", err)
	}
	if e2 := shimtest.WaitExit(t, dir); e2.Code != 0 || e2.Terminated {
		t.Errorf("record after the kill: got %+v, want unchanged", e2)
	}
}

// TestLingerEndsOnItsOwn: once the last descendant exits by itself the
// shim exits, without any request.
func TestLingerEndsOnItsOwn(t *testing.T) {
	t.Parallel()
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", `(setsid sleep 0.5 </dev/null >/dev/null 2>&1 &); exit 4`}})
	if e := shimtest.WaitExit(t, dir); e.Code != 4 {
		t.Fatalf("exit: got %+v, want exited 4", e)
	}
	if err := syscall.Kill(st.ShimPID, 0); err != nil {
		t.Fatalf("shim gone before its descendant: %v", err)
	}
	shimtest.WaitGone(t, st.ShimPID)
}

// TestTerminateKillsEscapedGrandchild: terminate of a running session
// kills the command and a grandchild that left its process group
// (setsid), also one that ignores SIGTERM (SIGKILL after the grace).
func TestTerminateKillsEscapedGrandchild(t *testing.T) {
	tests := []struct {
		name       string
		grandchild string
		minTook    time.Duration // the grace, when SIGTERM is ignored
	}{
		{"grandchild stops on TERM", `setsid sh -c ': >"$0.armed"; exec sleep 300' "$0"`, 0},
		{"grandchild ignores TERM", `setsid sh -c 'trap "" TERM; : >"$0.armed"; while :; do sleep 0.05; done' "$0"`, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pidf := filepath.Join(t.TempDir(), "gc")
			// ready only once the grandchild is armed (its trap set): a
			// TERM before that would end it early, as if the grace were
			// cut short.
			script := tt.grandchild + ` </dev/null >/dev/null 2>&1 & echo $! >"$0"; while [ ! -e "$0.armed" ]; do sleep 0.01; done; echo ready; wait`
			dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", script, pidf}})
			waitOutput(t, dir, "ready\n")
			gc := pidFrom(t, pidf)
			c := shimtest.Dial(t, dir)
			if s := waitStatus(t, c, "the grandchild counted", func(s sessiondir.Status) bool { return s.Descendants >= 1 }); s.State != sessiondir.StateRunning {
				t.Fatalf("status: got %+v, want running", s)
			}
			t0 := time.Now()
			e, err := c.Terminate(shimtest.CtxT(t, 15*time.Second), 500*time.Millisecond)
			took := time.Since(t0)
			if err != nil || e.Reason != journal.ReasonSignaled || e.Signal != int(syscall.SIGTERM) || !e.Terminated {
				t.Fatalf("terminate: got %+v %v, want signaled TERM, terminated", e, err)
			}
			if took < tt.minTook || took > tt.minTook+5*time.Second {
				t.Errorf("terminate took %v, want about %v", took, tt.minTook)
			}
			// Terminate answered only once nothing was left alive; the
			// shim reaps what it adopted.
			if s := processState(gc); s != "" && s != "Z" {
				t.Fatalf("grandchild %d: state %q after terminate, want dead", gc, s)
			}
			waitReaped(t, gc, 2*time.Second)
			shimtest.WaitGone(t, st.ShimPID)
		})
	}
}

// TestExitTruthUnderReaper: with the shim owning every wait, the
// command's status is still exact: a code, a signal, on pipes and on a
// terminal, also with an orphan left behind.
func TestExitTruthUnderReaper(t *testing.T) {
	tests := []struct {
		name   string
		tty    bool
		script string
		want   journal.Exit
	}{
		{"exit 3", false, `exit 3`, journal.Exit{Reason: journal.ReasonExited, Code: 3}},
		{"SIGKILL", false, `kill -9 $$`, journal.Exit{Reason: journal.ReasonSignaled, Signal: 9, Code: 137}},
		{"tty exit 5", true, `exit 5`, journal.Exit{Reason: journal.ReasonExited, Code: 5}},
		{"tty SIGKILL", true, `kill -9 $$`, journal.Exit{Reason: journal.ReasonSignaled, Signal: 9, Code: 137}},
		{"orphan left, exit 3", false, `(setsid sleep 300 </dev/null >/dev/null 2>&1 &); exit 3`,
			journal.Exit{Reason: journal.ReasonExited, Code: 3}},
		{"tty orphan left, SIGKILL", true, `(setsid sleep 300 </dev/null >/dev/null 2>&1 &); kill -9 $$`,
			journal.Exit{Reason: journal.ReasonSignaled, Signal: 9, Code: 137}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", tt.script}, TTY: tt.tty})
			e := shimtest.WaitExit(t, dir)
			if e.Reason != tt.want.Reason || e.Code != tt.want.Code || e.Signal != tt.want.Signal || e.Terminated {
				t.Fatalf("got %+v, want %+v", e, tt.want)
			}
			waitReaped(t, st.PID, 2*time.Second)
			// start's cleanup terminates any orphan and waits for the
			// shim to exit.
		})
	}
}

// TestDescendantsScan pins the /proc scan: it sees a process two levels
// down and its group, and not a zombie.
func TestDescendantsScan(t *testing.T) {
	ps, err := descendants(1)
	if err != nil || len(ps) == 0 {
		t.Fatalf("descendants of init: got %d %v, want some", len(ps), err)
	}
	me := os.Getpid()
	for _, p := range ps {
		if p.pid == me {
			return
		}
	}
	t.Errorf("descendants of init: this process (%d) is not among %d", me, len(ps))
}

// TestShimEndsWhenItsDirectoryGoes: a session whose directory is removed
// while its command runs (its sandbox's state deleted under it) cannot
// publish an exit record; once the command ends the shim exits instead of
// retrying the record for good.
func TestShimEndsWhenItsDirectoryGoes(t *testing.T) {
	dir := shimtest.SessionDir(t)
	st := shimtest.StartAt(t, dir, sessiondir.Spec{Argv: []string{"sh", "-c", `while [ -d "$0" ]; do sleep 0.05; done`, dir}})
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	shimtest.WaitGone(t, st.ShimPID)
}
