package fake_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/adapter/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Fixtures returns the suite's fixtures in the fake's vocabulary.
func Fixtures() conformance.Fixtures {
	fx := conformance.ShellFixtures()
	fx.Probe = func(host string) adapter.Command { return adapter.Command{Path: "probe", Args: []string{host}} }
	fx.ProbeHost = "allowed.example"
	return fx
}

func harness(opts ...fake.Option) conformance.Harness {
	return conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			a := fake.New(opts...)
			t.Cleanup(func() { _ = a.Close() })
			return conformance.Subject{Adapter: a, Outage: a.Outage, InterruptList: a.InterruptNextList}
		},
		Fixtures: Fixtures(),
		Timeout:  10 * time.Second,
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, harness())
}

// TestConformanceNoCapabilities runs the suite against a fake that
// advertises nothing: every optional call must refuse.
func TestConformanceNoCapabilities(t *testing.T) {
	conformance.Run(t, harness(fake.WithCapabilities()))
}

func newSandbox(t *testing.T, opts ...fake.Option) (*fake.Adapter, adapter.Handle) {
	t.Helper()
	a := fake.New(opts...)
	t.Cleanup(func() { _ = a.Close() })
	h, err := a.Create(context.Background(), "box", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return a, h
}

func TestVocabulary(t *testing.T) {
	tests := []struct {
		name           string
		cmd            adapter.Command
		stdout, stderr string
		exit           adapter.Exit
	}{
		{"echo builtin", adapter.Command{Path: "echo", Args: []string{"a", "b"}}, "a b\n", "", exited(0)},
		{"exit builtin", adapter.Command{Path: "exit", Args: []string{"4"}}, "", "", exited(4)},
		{"sh exit 3", adapter.Shell("exit 3"), "", "", exited(3)},
		{"seed exec_fail", adapter.Shell("echo oops; exit 3"), "oops\n", "", exited(3)},
		{"exit stops the script", adapter.Shell("exit 2; echo no"), "", "", exited(2)},
		{"status of last command", adapter.Shell("echo a; false"), "a\n", "", exited(1)},
		{"and-or", adapter.Shell("false && echo no || echo yes"), "yes\n", "", exited(0)},
		{"stderr", adapter.Shell("echo out; echo err >&2; echo e2 1>&2"), "out\n", "err\ne2\n", exited(0)},
		{"quotes", adapter.Shell(`echo 'a  b' "c \"d\""`), "a  b c \"d\"\n", "", exited(0)},
		{"printf", adapter.Shell(`printf '%s-%d\n' x 7`), "x-7\n", "", exited(0)},
		{"files", adapter.Shell("echo one > f; echo two >> f; cat f; cat < f"), "one\ntwo\none\ntwo\n", "", exited(0)},
		{"missing file", adapter.Shell("cat nope"), "", "cat: nope: No such file or directory\n", exited(1)},
		{"seq", adapter.Shell("seq 3"), "1\n2\n3\n", "", exited(0)},
		{"tick", adapter.Shell("tick 3 1ms"), "tick 1\ntick 2\ntick 3\n", "", exited(0)},
		{"not found", adapter.Command{Path: "nope"}, "", "sh: nope: not found\n", exited(127)},
		{"killed by a signal", adapter.Shell("echo a; kill -KILL $$; echo b"), "a\n", "", adapter.Exit{Code: -1, Signal: "SIGKILL", Reason: adapter.ReasonSignaled}},
		{"stty needs a tty", adapter.Shell("stty size"), "", "stty: standard input: Not a tty\n", exited(1)},
		{"probe with open egress", adapter.Command{Path: "probe", Args: []string{"x.example"}}, "probe: x.example: connected\n", "", exited(0)},
		{"syntax error", adapter.Shell("echo 'open"), "", "sh: syntax error: unterminated '\n", exited(2)},
	}
	a, h := newSandbox(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := a.Exec(context.Background(), h, tt.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if string(r.Stdout) != tt.stdout || string(r.Stderr) != tt.stderr || r.Exit != tt.exit {
				t.Errorf("got stdout %q stderr %q exit %+v, want %q %q %+v", r.Stdout, r.Stderr, r.Exit, tt.stdout, tt.stderr, tt.exit)
			}
		})
	}
}

// spawn starts the shell command cmd in h as a new session, failing t
// on an error; its stream is closed at t's cleanup.
func spawn(t *testing.T, ctx context.Context, a adapter.Adapter, h adapter.Handle, cmd string) adapter.Stream {
	t.Helper()
	st, err := a.Spawn(ctx, h, adapter.Shell(cmd), adapter.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func exited(code int) adapter.Exit { return adapter.Exit{Code: code, Reason: adapter.ReasonExited} }

// drain reads a stream to its end.
func drain(t *testing.T, st adapter.Stream) (out [2]string, last adapter.Frame) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case f, ok := <-st.Frames():
			if !ok {
				return out, last
			}
			if f.Terminal() {
				last = f
				continue
			}
			if f.Stream == adapter.Stderr {
				out[1] += string(f.Data)
			} else {
				out[0] += string(f.Data)
			}
		case <-timeout:
			t.Fatal("stream did not end")
		}
	}
}

// waitFor reads stdout until it contains want and returns what it read.
func waitFor(t *testing.T, st adapter.Stream, want string) string {
	t.Helper()
	var got string
	timeout := time.After(5 * time.Second)
	for !strings.Contains(got, want) {
		select {
		case f, ok := <-st.Frames():
			if !ok || f.Terminal() {
				t.Fatalf("stream ended with %v before %q (got %q)", f, want, got)
			}
			got += string(f.Data)
		case <-timeout:
			t.Fatalf("no %q in %q", want, got)
		}
	}
	return got
}

func TestTerminateEscalatesToKill(t *testing.T) {
	a, h := newSandbox(t)
	ctx := context.Background()
	st := spawn(t, ctx, a, h, "trap '' TERM; echo ready; sleep 60")
	waitFor(t, st, "ready")
	start := time.Now()
	ex, err := a.TerminateSession(ctx, h, st.SessionID(), 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	want := adapter.Exit{Code: -1, Signal: "SIGKILL", Reason: adapter.ReasonTerminated}
	if ex != want {
		t.Errorf("TerminateSession = %+v, want %+v (SIGTERM ignored, so SIGKILL after the grace)", ex, want)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("killed after %v, before the 50ms grace", d)
	}
	if _, last := drain(t, st); last.Exit == nil || *last.Exit != want {
		t.Errorf("terminal frame %v, want %+v", last, want)
	}
}

func TestTerminateBySIGTERM(t *testing.T) {
	a, h := newSandbox(t)
	ctx := context.Background()
	st := spawn(t, ctx, a, h, "cat")
	ex, err := a.TerminateSession(ctx, h, st.SessionID(), 30*time.Second)
	want := adapter.Exit{Code: -1, Signal: "SIGTERM", Reason: adapter.ReasonTerminated}
	if err != nil || ex != want {
		t.Errorf("TerminateSession = %+v, %v; want %+v at once", ex, err, want)
	}
}

func TestDestroyMidCommandIsLostNotExit(t *testing.T) {
	a, h := newSandbox(t)
	ctx := context.Background()
	st := spawn(t, ctx, a, h, "echo ready; cat")
	got := waitFor(t, st, "ready")
	if err := a.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	out, last := drain(t, st)
	if !errors.Is(last.Err, adapter.ErrLost) || last.Exit != nil {
		t.Errorf("terminal frame after destroy = %v, want ErrLost and no exit", last)
	}
	if got+out[0] != "ready\n" {
		t.Errorf("stdout = %q, want the bytes before the destroy", out[0])
	}
}

func TestSuspendEndsSessions(t *testing.T) {
	a, h := newSandbox(t)
	ctx := context.Background()
	st := spawn(t, ctx, a, h, "cat")
	if err := a.Suspend(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, last := drain(t, st); last.Exit == nil || last.Exit.Reason != adapter.ReasonTerminated || last.Exit.Success() {
		t.Errorf("terminal frame after suspend = %v, want terminated, not success", last)
	}
	_, err := a.Exec(ctx, h, adapter.Shell("true"))
	if !errors.Is(err, adapter.ErrInvalid) {
		t.Errorf("Exec in a parked sandbox = %v, want invalid", err)
	}
}

func TestTTYSession(t *testing.T) {
	a, h := newSandbox(t)
	ctx := context.Background()
	st, err := a.Spawn(ctx, h, adapter.Shell("stty size; echo err >&2; cat; stty size"), adapter.SpawnOptions{TTY: &adapter.TTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := waitFor(t, st, "err\n")
	if err := a.Resize(ctx, h, st.SessionID(), adapter.TTYSize{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(ctx, h, st.SessionID()); err != nil {
		t.Fatal(err)
	}
	out, last := drain(t, st)
	if got+out[0] != "24 80\nerr\n50 132\n" || out[1] != "" {
		t.Errorf("tty output = %q / %q, want one stream with both sizes", out[0], out[1])
	}
	if last.Exit == nil || !last.Exit.Success() {
		t.Errorf("terminal = %v, want exit 0", last)
	}
}

func TestExecContextStopsCommand(t *testing.T) {
	a, h := newSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := a.Exec(ctx, h, adapter.Shell("sleep 60"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec past its deadline = %v, want DeadlineExceeded", err)
	}
}

func TestSlowConsumerDoesNotBlockCommand(t *testing.T) {
	a, h := newSandbox(t, fake.WithBuffer(1))
	ctx := context.Background()
	st := spawn(t, ctx, a, h, "seq 20000")
	// Nobody reads; the command still finishes.
	deadline := time.Now().Add(5 * time.Second)
	for {
		infos, err := a.Sessions(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		if infos[0].State == adapter.SessionExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("command blocked behind a reader that does not read")
		}
		time.Sleep(time.Millisecond)
	}
	out, _ := drain(t, st)
	if len(out[0]) != 108894 {
		t.Errorf("stdout has %d bytes, want 108894", len(out[0]))
	}
}

func TestCloseEndsEverything(t *testing.T) {
	a := fake.New()
	ctx := context.Background()
	h, _ := a.Create(ctx, "box", adapter.CreateOptions{})
	st, err := a.Spawn(ctx, h, adapter.Shell("cat"), adapter.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	for range st.Frames() { // closed by Close: this ends
	}
	if _, err := a.Get(ctx, "box"); !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("Get after Close = %v, want unavailable", err)
	}
}

func TestHandleHidesToken(t *testing.T) {
	_, h := newSandbox(t)
	for _, s := range []string{h.String(), fmt.Sprintf("%v %+v %#v %s", h, h, h, h)} {
		if strings.Contains(s, "fake-token") {
			t.Errorf("handle printed its token: %s", s)
		}
	}
}
