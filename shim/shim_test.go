package shim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

func TestMain(m *testing.M) {
	os.Exit(shimtest.Run(m, func(args []string) int { return Main(args, Hooks{}) }, map[string]func() int{helperEnv: launcherHelper}))
}

func TestExitCode(t *testing.T) {
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	e := shimtest.WaitExit(t, dir)
	if e.Reason != journal.ReasonExited || e.Code != 3 {
		t.Fatalf("got %+v, want exited 3", e)
	}
	out, term := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
	if got := out[wire.StreamStdout].String(); got != "out\n" {
		t.Errorf("stdout: got %q, want %q", got, "out\n")
	}
	if got := out[wire.StreamStderr].String(); got != "err\n" {
		t.Errorf("stderr: got %q, want %q", got, "err\n")
	}
	we, err := term.Exit()
	if err != nil || term.Kind != wire.FrameExit || we.Code != 3 || we.Lengths["stdout"] != 4 || we.Lengths["stderr"] != 4 {
		t.Fatalf("terminal frame: got %s %+v %v, want exit 3 with lengths 4/4", term.Kind, we, err)
	}
}

func TestKilledBySignal(t *testing.T) {
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sleep", "60"}})
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e := shimtest.WaitExit(t, dir)
	if e.Reason != journal.ReasonSignaled || e.Signal != 9 || e.Code != 137 {
		t.Fatalf("got %+v, want signaled 9 (code 137)", e)
	}
}

func TestCatEndsOnCloseStdinOnly(t *testing.T) {
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"cat"}})
	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 10*time.Second)
	for _, p := range []string{"one\n", "two", "\x00binary\xff\n"} {
		if err := c.WriteStdin(ctx, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if st, err := c.Status(ctx); err != nil || st.State != sessiondir.StateRunning {
		t.Fatalf("after writes: got %+v %v, want running (cat must end on close-stdin only)", st, err)
	}
	if err := c.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx); err != nil && !errors.Is(err, sessiondir.ErrExited) {
		t.Fatalf("repeat close: got %v, want nil or ErrExited", err)
	}
	e := shimtest.WaitExit(t, dir)
	if e.Reason != journal.ReasonExited || e.Code != 0 {
		t.Fatalf("got %+v, want exited 0", e)
	}
	out, _ := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
	if got, want := out[wire.StreamStdout].String(), "one\ntwo\x00binary\xff\n"; got != want {
		t.Fatalf("stdout: got %q, want %q", got, want)
	}
	if err := c.WriteStdin(ctx, []byte("late")); !errors.Is(err, sessiondir.ErrExited) {
		t.Fatalf("write after exit: got %v, want ErrExited", err)
	}
}

func TestWriteAfterExit(t *testing.T) {
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", "exit 0"}})
	c := shimtest.Dial(t, dir)
	shimtest.WaitExit(t, dir)
	ctx := shimtest.CtxT(t, 10*time.Second)
	// Through the shim while it lingers, or from disk once it is gone:
	// either way the answer is ErrExited, never a transport error.
	for i := range 2 {
		if err := c.WriteStdin(ctx, []byte("x")); !errors.Is(err, sessiondir.ErrExited) {
			t.Fatalf("write %d: got %v, want ErrExited", i, err)
		}
		if err := c.Signal(ctx, syscall.SIGTERM); !errors.Is(err, sessiondir.ErrExited) {
			t.Fatalf("signal %d: got %v, want ErrExited", i, err)
		}
		shimtest.WaitGone(t, st.ShimPID)
	}
	if _, err := os.Stat(filepath.Join(dir, sessiondir.SocketFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ctl.sock after the shim exited: %v", err)
	}
	e, err := c.Terminate(ctx, time.Second)
	if err != nil || e.Code != 0 || e.Reason != journal.ReasonExited {
		t.Fatalf("terminate after exit: got %+v %v, want the exit record", e, err)
	}
}

func TestStartMissingBinary(t *testing.T) {
	dir := shimtest.SessionDir(t)
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "x", Argv: []string{"/nonexistent/bin"}, Env: shimtest.TestEnv})
	var se *launch.StartError
	if !errors.As(err, &se) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want a StartError matching fs.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), "/nonexistent/bin") {
		t.Errorf("error %q does not name the binary", err)
	}
	shimtest.WaitGone(t, se.ShimPID)
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("session dir left behind: %v", err)
	}
	_, err = shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "x", Argv: []string{"no-such-command-xyz"}, Env: shimtest.TestEnv})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("PATH lookup: got %v, want fs.ErrNotExist", err)
	}
}

func TestStartRunsBeforeReturn(t *testing.T) {
	// The spawn-ack trap: a write right after Start must reach a running
	// command, and the pid must be the command's.
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"cat"}})
	shimtest.CheckCat(t, dir, st)
}

func TestStartExists(t *testing.T) {
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"true"}})
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "t1", Argv: []string{"true"}})
	if !errors.Is(err, sessiondir.ErrExists) {
		t.Fatalf("got %v, want ErrExists", err)
	}
}

func TestSocketPathTooLong(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 5*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "x", Argv: []string{"true"}})
	if !errors.Is(err, sessiondir.ErrInvalid) || !strings.Contains(err.Error(), "unix limit") {
		t.Fatalf("got %v, want ErrInvalid about the unix limit", err)
	}
}

func TestTerminate(t *testing.T) {
	tests := []struct {
		name   string
		script string
		want   journal.Exit
		slow   bool // must take at least the grace
	}{
		{"traps TERM", `trap 'echo bye; exit 7' TERM; echo ready; while :; do sleep 0.05; done`, journal.Exit{Reason: "exited", Code: 7}, false},
		{"ignores TERM", `trap '' TERM; echo ready; while :; do sleep 0.05; done`, journal.Exit{Reason: "signaled", Signal: 9, Code: 137}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", tt.script}})
			waitOutput(t, dir, "ready\n")
			c := shimtest.Dial(t, dir)
			grace := 700 * time.Millisecond
			t0 := time.Now()
			e, err := c.Terminate(shimtest.CtxT(t, 10*time.Second), grace)
			took := time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			if e.Reason != tt.want.Reason || e.Code != tt.want.Code || e.Signal != tt.want.Signal {
				t.Fatalf("got %+v, want %+v", e, tt.want)
			}
			if tt.slow && took < grace {
				t.Errorf("KILL came after %v, before the grace %v", took, grace)
			}
			if !tt.slow && took >= grace {
				t.Errorf("a TERM-trapping command took %v, not less than the grace", took)
			}
			// The record is in the journal when Terminate answers.
			st, err := sessiondir.ReadStatus(dir)
			if err != nil || st.State != sessiondir.StateExited || st.Exit.Code != e.Code {
				t.Fatalf("ReadStatus after terminate: got %+v %v", st, err)
			}
		})
	}
}

// waitOutput waits until the session's stdout starts with want.
func waitOutput(t *testing.T, dir, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := shimtest.ReadStream(dir, "stdout")
		if strings.HasPrefix(string(b), want) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, _ := shimtest.ReadStream(dir, "stdout")
	t.Fatalf("stdout: got %q, want prefix %q", b, want)
}

func TestAttachCursorConcatenates(t *testing.T) {
	script := `i=0; while [ $i -lt 300 ]; do echo "line $i of stdout"; echo "line $i of stderr" >&2; i=$((i+1)); done; read x; echo "after $x"; exit 5`
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", script}})
	waitOutput(t, dir, "line 0")
	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 10*time.Second)
	// The first attach runs while the command is live and is cut at a
	// cursor; the second resumes from it.
	time.Sleep(200 * time.Millisecond)
	part := map[string][]byte{}
	for _, s := range []string{"stdout", "stderr"} {
		b, err := shimtest.ReadStream(dir, s)
		if err != nil {
			t.Fatal(err)
		}
		part[s] = b[:len(b)/2]
	}
	if err := c.WriteStdin(ctx, []byte("input\n")); err != nil {
		t.Fatal(err)
	}
	full, term := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
	rest, term2 := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{Stdout: int64(len(part["stdout"])), Stderr: int64(len(part["stderr"]))})
	for _, s := range []wire.StreamID{wire.StreamStdout, wire.StreamStderr} {
		got := append(bytes.Clone(part[s.StreamName()]), rest[s].Bytes()...)
		if !bytes.Equal(got, full[s].Bytes()) {
			t.Fatalf("%s: cursor read + rest (%d bytes) differs from one read (%d bytes)", s.StreamName(), len(got), full[s].Len())
		}
	}
	if !strings.HasSuffix(full[wire.StreamStdout].String(), "after input\n") {
		t.Fatalf("stdout ends %q", full[wire.StreamStdout].String())
	}
	for _, f := range []wire.Frame{term, term2} {
		e, err := f.Exit()
		if err != nil || e.Code != 5 {
			t.Fatalf("terminal: got %s %+v %v, want exit 5", f.Kind, e, err)
		}
	}
	// A cursor beyond the end is an error frame, invalid.
	_, bad := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{Stdout: 1 << 40})
	if we, err := bad.Err(); err != nil || we.Code != wire.CodeInvalid {
		t.Fatalf("cursor beyond end: got %s %+v %v, want error invalid", bad.Kind, we, err)
	}
}

func TestPTY(t *testing.T) {
	dir, _ := shimtest.Start(t, sessiondir.Spec{TTY: true, Rows: 30, Cols: 100, Argv: []string{"sh", "-c",
		`tty >/dev/null && echo "is a tty"; stty size; read x; stty size; read y; echo "got $y"`}})
	waitOutput(t, dir, "is a tty\r\n30 100\r\n")
	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 10*time.Second)
	if err := c.Resize(ctx, 50, 132); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, []byte("last\n")); err != nil {
		t.Fatal(err)
	}
	e := shimtest.WaitExit(t, dir)
	if e.Code != 0 {
		t.Fatalf("got %+v, want exit 0", e)
	}
	out, _ := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
	got := out[wire.StreamStdout].String()
	for _, want := range []string{"is a tty", "30 100", "50 132", "got last"} {
		if !strings.Contains(got, want) {
			t.Errorf("output %q lacks %q", got, want)
		}
	}
	if out[wire.StreamStderr].Len() != 0 {
		t.Errorf("a TTY session has no stderr stream")
	}
}

func TestPTYCloseStdin(t *testing.T) {
	dir, _ := shimtest.Start(t, sessiondir.Spec{TTY: true, Argv: []string{"cat"}})
	c := shimtest.Dial(t, dir)
	ctx := shimtest.CtxT(t, 10*time.Second)
	// A partial line: close-stdin must still end cat (two ^Ds).
	if err := c.WriteStdin(ctx, []byte("partial")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if st, _ := c.Status(ctx); st.State != sessiondir.StateRunning {
		t.Fatalf("cat ended before close-stdin: %+v", st)
	}
	if err := c.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if e := shimtest.WaitExit(t, dir); e.Code != 0 || e.Reason != journal.ReasonExited {
		t.Fatalf("got %+v, want exited 0", e)
	}
}

func TestResizePipesInvalid(t *testing.T) {
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sleep", "30"}})
	c := shimtest.Dial(t, dir)
	if err := c.Resize(shimtest.CtxT(t, 5*time.Second), 10, 10); !errors.Is(err, sessiondir.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
}

func TestStdinBlockedDoesNotBlockControl(t *testing.T) {
	// sleep never reads stdin: a big write blocks, and signal, status and
	// terminate still answer at once.
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sleep", "60"}})
	c := shimtest.Dial(t, dir)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	werr := make(chan error, 1)
	go func() { werr <- c.WriteStdin(wctx, make([]byte, 4<<20)) }()
	time.Sleep(200 * time.Millisecond)
	ctx := shimtest.CtxT(t, 5*time.Second)
	t0 := time.Now()
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	e, err := c.Terminate(ctx, time.Second)
	if err != nil || e.Signal != int(syscall.SIGTERM) {
		t.Fatalf("terminate: got %+v %v, want signaled TERM", e, err)
	}
	if took := time.Since(t0); took > 3*time.Second {
		t.Fatalf("control took %v behind a blocked stdin write", took)
	}
	select {
	case err := <-werr:
		if !errors.Is(err, sessiondir.ErrExited) {
			t.Fatalf("blocked write: got %v, want ErrExited", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked write never answered after the exit")
	}
}

// helperEnv makes the test binary a launcher helper: it starts a session
// whose shim outlives it, prints the session dir, then sleeps until it is
// killed.
const helperEnv = "RUNNER_SHIM_TEST_LAUNCHER"

func launcherHelper() int {
	dir := os.Getenv(helperEnv)
	exe, _ := os.Executable()
	os.Setenv(shimtest.AsShimEnv, "1")
	_, err := shimtest.ColdStart(context.Background(), []string{exe}, dir, sessiondir.Spec{ID: "survivor", Env: shimtest.TestEnv,
		Argv: []string{"sh", "-c", `echo started; read x; echo "got $x"; exit 42`}})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("ok")
	time.Sleep(time.Minute)
	return 0
}

func TestSurvivesLauncherKill(t *testing.T) {
	dir := shimtest.SessionDir(t)
	exe, _ := os.Executable()
	helper := exec.Command(exe)
	helper.Env = append(os.Environ(), helperEnv+"="+dir)
	helper.Env = append(helper.Env, shimtest.AsShimEnv+"=0")
	stdout, _ := helper.StdoutPipe()
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 64)
	n, _ := stdout.Read(line)
	if string(line[:n]) != "ok\n" {
		helper.Process.Kill()
		helper.Wait()
		t.Fatalf("helper: %q", line[:n])
	}
	helper.Process.Kill() // kill -9 the launcher mid-command
	helper.Wait()

	st, err := sessiondir.ReadStatus(dir)
	if err != nil || st.State != sessiondir.StateRunning {
		t.Fatalf("after the launcher died: got %+v %v, want running", st, err)
	}
	t.Cleanup(func() { shimtest.WaitGone(t, st.ShimPID) })
	list, err := sessiondir.List(filepath.Dir(dir))
	if err != nil || len(list) != 1 || list[0].ID != "survivor" || list[0].State != sessiondir.StateRunning {
		t.Fatalf("list: got %+v %v", list, err)
	}
	c := shimtest.Dial(t, dir) // rejoin
	ctx := shimtest.CtxT(t, 10*time.Second)
	if err := c.WriteStdin(ctx, []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	out, term := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
	if got := out[wire.StreamStdout].String(); got != "started\ngot hello\n" {
		t.Fatalf("stdout: got %q", got)
	}
	e, err := term.Exit()
	if err != nil || term.Kind != wire.FrameExit || e.Code != 42 {
		t.Fatalf("terminal: got %s %+v %v, want exit 42", term.Kind, e, err)
	}
}

func TestLostWhenShimKilled(t *testing.T) {
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sleep", "30"}})
	if err := syscall.Kill(st.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	shimtest.WaitGone(t, st.ShimPID)
	syscall.Kill(st.PID, syscall.SIGKILL) // our own orphaned command
	got, err := sessiondir.ReadStatus(dir)
	if err != nil || got.State != sessiondir.StateLost {
		t.Fatalf("got %+v %v, want lost", got, err)
	}
	_, term := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
	if term.Kind != wire.FrameLost {
		t.Fatalf("terminal: got %s, want lost", term.Kind)
	}
	c := shimtest.Dial(t, dir)
	if err := c.WriteStdin(shimtest.CtxT(t, 5*time.Second), []byte("x")); !errors.Is(err, sessiondir.ErrLost) {
		t.Fatalf("write to a lost session: got %v, want ErrLost", err)
	}
}
