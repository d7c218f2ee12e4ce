package e2b_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
)

type sandboxFixture struct {
	fixture
	sb   e2b.Sandbox
	envd *e2b.Envd
	dir  string
}

func newSandbox(t *testing.T, opts e2btest.Options) sandboxFixture {
	t.Helper()
	f := newFixture(t, opts)
	sb, err := f.c.Create(ctxFor(t), e2b.NewSandbox{TemplateID: "runner", Secure: true})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	dir, _ := f.srv.Dir(sb.SandboxID)
	return sandboxFixture{fixture: f, sb: sb, envd: f.c.Envd(sb), dir: dir}
}

func argv(cmd string, args ...string) e2b.StartRequest {
	return e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: cmd, Args: args}}
}

func sh(script string) e2b.StartRequest { return argv("/bin/sh", "-c", script) }

func TestBinaryStdoutThroughChunks(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	want := make([]byte, 1<<20+7)
	if _, err := rand.Read(want); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "blob"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := s.envd.Start(ctx, argv("cat", "blob"))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer st.Close()
	var got []byte
	var chunks, biggest int
	var end *e2b.EndEvent
	for {
		ev, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("recv after %d bytes: %v", len(got), err)
		}
		if len(ev.Stdout) > 0 {
			chunks++
			biggest = max(biggest, len(ev.Stdout))
		}
		if len(ev.Stderr) > 0 || len(ev.PTY) > 0 {
			t.Errorf("unexpected stderr/pty output %q %q", ev.Stderr, ev.PTY)
		}
		got = append(got, ev.Stdout...)
		if ev.End != nil {
			end = ev.End
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("stdout: got %d bytes, want the %d written (byte-exact)", len(got), len(want))
	}
	if biggest > 32<<10 || chunks < len(want)/(32<<10) {
		t.Errorf("chunks: %d, biggest %d bytes; want ≥ %d chunks of ≤ 32 KiB", chunks, biggest, len(want)/(32<<10))
	}
	if end == nil || end.ExitCode != 0 || !end.Exited || end.Status != "exit status 0" {
		t.Errorf("end: got %+v, want exit 0", end)
	}
}

func TestStdoutStderrApart(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	st, err := s.envd.Start(ctxFor(t), sh(`printf out; printf err >&2; exit 3`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := st.Drain()
	if err != nil {
		t.Fatal(err)
	}
	if string(out.Stdout) != "out" || string(out.Stderr) != "err" || out.End.ExitCode != 3 || !out.End.Exited {
		t.Errorf("got stdout %q stderr %q end %+v; want out, err, exit 3", out.Stdout, out.Stderr, out.End)
	}
}

func TestExitCodes(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	for _, tc := range []struct {
		name   string
		script string
		want   e2b.EndEvent
	}{
		{"zero", "exit 0", e2b.EndEvent{ExitCode: 0, Exited: true, Status: "exit status 0"}},
		// envd sends cmd.Wait's error as the end event's error.
		{"three", "exit 3", e2b.EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3", Error: "exit status 3"}},
		{"killed", "kill -9 $$", e2b.EndEvent{ExitCode: -1, Exited: false, Status: "signal: killed", Error: "signal: killed"}},
		{"terminated", "kill -TERM $$", e2b.EndEvent{ExitCode: -1, Exited: false, Status: "signal: terminated", Error: "signal: terminated"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := s.envd.Start(ctxFor(t), sh(tc.script))
			if err != nil {
				t.Fatal(err)
			}
			out, err := st.Drain()
			if err != nil {
				t.Fatal(err)
			}
			if out.End != tc.want {
				t.Errorf("end: got %+v, want %+v", out.End, tc.want)
			}
		})
	}
}

func TestSendSignal(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	for _, tc := range []struct {
		sig    e2b.Signal
		status string
	}{{e2b.SIGTERM, "signal: terminated"}, {e2b.SIGKILL, "signal: killed"}} {
		st, err := s.envd.Start(ctx, argv("sleep", "60"))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.envd.SendSignal(ctx, e2b.Selector{PID: st.PID()}, tc.sig); err != nil {
			t.Fatalf("signal %d: %v", tc.sig, err)
		}
		out, err := st.Drain()
		if err != nil {
			t.Fatal(err)
		}
		if out.End.Status != tc.status || out.End.ExitCode != -1 {
			t.Errorf("after signal %d: end %+v, want %s", tc.sig, out.End, tc.status)
		}
	}
	err := s.envd.SendSignal(ctx, e2b.Selector{PID: 1}, e2b.Signal(2))
	wantKind(t, "a signal envd does not deliver", err, adapter.KindInvalid)
}

// allBytes is every byte value, NULs included, twice.
func allBytes() []byte {
	b := make([]byte, 512)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestStdinNULsAndRealClose(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, argv("cat"))
	if err != nil {
		t.Fatal(err)
	}
	// Start returned after envd's start event: the pid is known and the
	// process takes input at once.
	sel := e2b.Selector{PID: st.PID()}
	want := allBytes()
	if err := s.envd.SendInput(ctx, sel, want[:256], false); err != nil {
		t.Fatalf("send input: %v", err)
	}
	if err := s.envd.SendInput(ctx, sel, want[256:], false); err != nil {
		t.Fatalf("send input: %v", err)
	}
	if err := s.envd.CloseStdin(ctx, sel); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	out, err := st.Drain()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Stdout, want) || out.End.ExitCode != 0 {
		t.Errorf("cat gave %d bytes (exit %d), want the %d sent back byte-exact and exit 0 on EOF", len(out.Stdout), out.End.ExitCode, len(want))
	}
	// After the exit envd no longer knows the pid.
	err = s.envd.SendInput(ctx, sel, []byte("late"), false)
	if !e2b.IsProcessNotFound(err) || adapter.KindOf(err) != adapter.KindProvider {
		t.Errorf("write after exit: got %v (kind %s), want envd's not_found as kind provider", err, adapter.KindOf(err))
	}
}

// TestStartWaitsForRegistration is the seeds' first trap: the caller
// writes stdin the moment Start returns, by tag, while envd registers the
// process slowly. Start must not return before envd's start event.
func TestStartWaitsForRegistration(t *testing.T) {
	s := newSandbox(t, e2btest.Options{RegisterDelay: 300 * time.Millisecond})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: "head", Args: []string{"-c", "5"}}, Tag: "early"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.envd.SendInput(ctx, e2b.Selector{Tag: "early"}, []byte("hello"), false); err != nil {
		t.Fatalf("write right after Start returned: %v", err)
	}
	out, err := st.Drain()
	if err != nil || string(out.Stdout) != "hello" || out.End.ExitCode != 0 {
		t.Errorf("got %q, %+v, %v; want hello and exit 0", out.Stdout, out.End, err)
	}
}

func TestStreamInputKeepsOrder(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: "cat"}, Tag: "catter"})
	if err != nil {
		t.Fatal(err)
	}
	in, err := s.envd.StreamInput(ctx, e2b.Selector{Tag: "catter"})
	if err != nil {
		t.Fatalf("stream input: %v", err)
	}
	var want []byte
	for i := range 50 {
		chunk := append(allBytes()[:i+1], '\n')
		want = append(want, chunk...)
		if err := in.Write(chunk, false); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if err := in.Close(); err != nil {
		t.Fatalf("close input stream: %v", err)
	}
	if err := s.envd.CloseStdin(ctx, e2b.Selector{Tag: "catter"}); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	out, err := st.Drain()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Stdout, want) {
		t.Errorf("stdout: got %d bytes, want the %d streamed, in order", len(out.Stdout), len(want))
	}

	in, err = s.envd.StreamInput(ctx, e2b.Selector{Tag: "gone"})
	if err == nil {
		err = in.Close()
	}
	if !e2b.IsProcessNotFound(err) {
		t.Errorf("stream input to an unknown tag: got %v, want envd's not_found", err)
	}
}

// TestStreamInputToAnExitedProcess: writes into a process that exited end
// the input stream with envd's error; nothing hangs.
func TestStreamInputToAnExitedProcess(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, argv("head", "-c", "1"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := s.envd.StreamInput(ctx, e2b.Selector{PID: st.PID()})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Write([]byte("x"), false); err != nil {
		t.Fatalf("first write: %v", err)
	}
	out, err := st.Drain()
	if err != nil || string(out.Stdout) != "x" || out.End.ExitCode != 0 {
		t.Fatalf("head: %q %+v %v", out.Stdout, out.End, err)
	}
	var werr error
	for i := 0; i < 1000 && werr == nil; i++ {
		werr = in.Write([]byte("more"), false)
	}
	cerr := in.Close()
	if adapter.KindOf(cerr) != adapter.KindProvider {
		t.Errorf("close after writing past the exit: got %v, want envd's error (kind provider)", cerr)
	}
	if werr != nil && adapter.KindOf(werr) != adapter.KindProvider {
		t.Errorf("write past the exit: got %v (kind %s), want envd's error, kind provider", werr, adapter.KindOf(werr))
	}
	if again := in.Close(); again != cerr {
		t.Errorf("second close: %v, want the first's %v", again, cerr)
	}
}

func TestStdinDisabled(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	no := false
	st, err := s.envd.Start(ctxFor(t), e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: "cat"}, Stdin: &no})
	if err != nil {
		t.Fatal(err)
	}
	out, err := st.Drain()
	if err != nil || out.End.ExitCode != 0 || len(out.Stdout) != 0 {
		t.Errorf("cat without stdin: %+v, %v; want it to read EOF at once and exit 0", out, err)
	}
}

// TestProcessOutlivesItsStream: envd neither kills a process when its
// client goes away nor keeps what it printed meanwhile.
func TestProcessOutlivesItsStream(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, e2b.StartRequest{
		Process: e2b.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `while read l; do echo "got:$l"; echo "$l" >> seen; done`}},
		Tag:     "loop",
	})
	if err != nil {
		t.Fatal(err)
	}
	pid := st.PID()
	st.Close()

	sel := e2b.Selector{Tag: "loop"}
	if err := s.envd.SendInput(ctx, sel, []byte("a\n"), false); err != nil {
		t.Fatalf("send input after the stream closed: %v", err)
	}
	waitFor(t, "the loop to see a", func() bool {
		b, _ := os.ReadFile(filepath.Join(s.dir, "seen"))
		return string(b) == "a\n"
	})
	ps, err := s.envd.List(ctx)
	if err != nil || len(ps) != 1 || ps[0].PID != pid || ps[0].Tag != "loop" || ps[0].Config.Cmd != "/bin/sh" {
		t.Fatalf("list: got %+v, %v; want the one loop process %d", ps, err, pid)
	}

	again, err := s.envd.Connect(ctx, sel)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if again.PID() != pid {
		t.Errorf("connect: pid %d, want %d", again.PID(), pid)
	}
	if err := s.envd.SendInput(ctx, sel, []byte("b\n"), false); err != nil {
		t.Fatal(err)
	}
	if err := s.envd.CloseStdin(ctx, sel); err != nil {
		t.Fatal(err)
	}
	out, err := again.Drain()
	if err != nil {
		t.Fatal(err)
	}
	// "got:a" went out while nobody listened: it is gone for good.
	if string(out.Stdout) != "got:b\n" || out.End.ExitCode != 0 {
		t.Errorf("after reconnecting: stdout %q exit %d; want only %q and exit 0", out.Stdout, out.End.ExitCode, "got:b\n")
	}
	// envd keeps an ended process's end event (30 s): a Connect to it
	// gets the start event and the end, not not_found.
	ended, err := s.envd.Connect(ctx, sel)
	if err != nil || ended.PID() != pid {
		t.Fatalf("connect to an exited process: got %v, want its start event (pid %d)", err, pid)
	}
	out, err = ended.Drain()
	if err != nil || len(out.Stdout) != 0 || out.End != (e2b.EndEvent{Exited: true, Status: "exit status 0"}) {
		t.Errorf("connect to an exited process: got %+v, %v; want only its end, exit 0", out, err)
	}
}

// TestLifetimeKillsProcess: Connect-Timeout-Ms on Start is the process's
// lifetime, so the client sends it only when asked and never derives it
// from the context.
func TestLifetimeKillsProcess(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)

	req := argv("sleep", "60")
	req.Lifetime = 300 * time.Millisecond
	st, err := s.envd.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pid := st.PID()
	_, err = st.Drain()
	var e *e2b.Error
	if !errors.As(err, &e) || e.Code != e2b.CodeDeadlineExceeded || adapter.KindOf(err) != adapter.KindUnavailable {
		t.Errorf("stream of a process past its lifetime: got %v, want deadline_exceeded, kind unavailable", err)
	}
	waitFor(t, "the process to be killed", func() bool { return !alive(pid) })

	// A short context is the stream's bound only: the process survives it.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	st, err = s.envd.Start(short, argv("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("recv past the context's deadline: got %v, want context.DeadlineExceeded", err)
	}
	time.Sleep(300 * time.Millisecond)
	if !alive(st.PID()) {
		t.Fatalf("the process died with its stream's context; envd would have kept it")
	}
	if err := s.envd.SendSignal(ctx, e2b.Selector{PID: st.PID()}, e2b.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// TestCloseUnblocksRecv: Close from another goroutine ends a blocked Recv
// as a cancellation (never as a provider failure or an end), and the
// process lives on.
func TestCloseUnblocksRecv(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, argv("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := st.Recv()
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	st.Close()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Errorf("recv after close: got %v, want context.Canceled", err)
	}
	if !alive(st.PID()) {
		t.Errorf("closing the stream killed the process")
	}
	if err := s.envd.SendSignal(ctx, e2b.Selector{PID: st.PID()}, e2b.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

func alive(pid uint32) bool {
	// A zombie still answers kill 0; the stand-in reaps at once, so a
	// killed process vanishes quickly.
	err := syscall.Kill(int(pid), 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func TestPTY(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: "cat"}, PTY: &e2b.PTYSize{Cols: 100, Rows: 30}})
	if err != nil {
		t.Fatal(err)
	}
	sel := e2b.Selector{PID: st.PID()}
	err = s.envd.CloseStdin(ctx, sel)
	var e *e2b.Error
	if !errors.As(err, &e) || e.Code != e2b.CodeUnknown || adapter.KindOf(err) != adapter.KindProvider {
		t.Errorf("close stdin of a PTY process: got %v, want envd's refusal (unknown, kind provider)", err)
	}
	if err := s.envd.Resize(ctx, sel, e2b.PTYSize{Cols: 120, Rows: 40}); err != nil {
		t.Errorf("resize: %v", err)
	}
	if err := s.envd.SendInput(ctx, sel, []byte("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	// ^D at the start of a line is the terminal's EOF.
	if err := s.envd.SendInput(ctx, sel, []byte{0x04}, true); err != nil {
		t.Fatal(err)
	}
	out, err := st.Drain()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out.PTY), "hello") || len(out.Stdout) != 0 || out.End.ExitCode != 0 {
		t.Errorf("pty: got pty %q stdout %q end %+v; want hello on the pty and exit 0", out.PTY, out.Stdout, out.End)
	}
}

func TestKeepalivesAreSkipped(t *testing.T) {
	s := newSandbox(t, e2btest.Options{KeepaliveInterval: 5 * time.Millisecond})
	st, err := s.envd.Start(ctxFor(t), sh(`sleep 0.2; echo hi`))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil || string(ev.Stdout) != "hi\n" {
		t.Fatalf("first event: %+v, %v; want stdout hi (keepalives skipped)", ev, err)
	}
	out, err := st.Drain()
	if err != nil || out.End.ExitCode != 0 {
		t.Errorf("drain: %+v, %v", out, err)
	}
}

func TestStartFailures(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	// envd's /bin/sh wrapper starts, then finds no program: exit 127.
	st, err := s.envd.Start(ctx, argv("/no/such/program"))
	if err != nil {
		t.Fatalf("start of a missing program: %v, want a start event", err)
	}
	if out, err := st.Drain(); err != nil || out.End.ExitCode != 127 || !out.End.Exited || out.End.Error != "exit status 127" {
		t.Errorf("start of a missing program: got %+v, %v; want exit 127", out, err)
	}
	// A missing cwd is invalid_argument before any start event.
	missing := argv("true")
	missing.Process.Cwd = filepath.Join(t.TempDir(), "absent")
	_, err = s.envd.Start(ctx, missing)
	wantKind(t, "start in a missing cwd", err, adapter.KindInvalid)
	_, err = s.envd.Start(ctx, argv(""))
	wantKind(t, "start without a command", err, adapter.KindInvalid)
	_, err = s.envd.Connect(ctx, e2b.Selector{})
	wantKind(t, "connect with an empty selector", err, adapter.KindInvalid)
	_, err = s.envd.Connect(ctx, e2b.Selector{PID: 99999999})
	if !e2b.IsProcessNotFound(err) || errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("connect to an unknown pid: got %v, want envd's not_found and never adapter.ErrNotFound", err)
	}
}

// TestStreamCutByPause: a pause cuts open streams; the client reports a
// transient failure, never an end.
func TestStreamCutByPause(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, argv("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.Pause(ctx, s.sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	_, err = st.Drain()
	wantKind(t, "a stream cut by a pause", err, adapter.KindUnavailable)
	if _, _, err := s.c.Connect(ctx, s.sb.SandboxID, 60); err != nil {
		t.Fatal(err)
	}
	ps, err := s.envd.List(ctx)
	if err != nil || len(ps) != 1 || ps[0].PID != st.PID() {
		t.Errorf("after resume: processes %+v, %v; want the paused sleep to have survived", ps, err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
