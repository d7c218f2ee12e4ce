package daytona

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona/daytonatest"
)

// newExec returns the executor of a fresh started sandbox in a stand-in.
func newExec(t *testing.T) (*sessionExec, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	srv := daytonatest.New(t, daytonatest.Options{})
	c, err := New(Config{APIKey: NewSecret(srv.APIKey), APIURL: srv.URL(), PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAdapter(AdapterConfig{Client: c, Version: "v0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	sb, err := c.Create(ctx, CreateSandbox{Name: "exec"})
	if err == nil {
		sb, err = c.WaitState(ctx, sb.ID, StateStarted)
	}
	if err != nil {
		t.Fatal(err)
	}
	tb, err := c.Toolbox(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	return &sessionExec{a: a, id: sb.ID, tb: tb}, ctx
}

// TestExecutorStatusOnlyFromTrailer: a script killed before its trailer
// (the toolbox still records an exit code, 137) is a transport failure,
// never that status; a forged trailer in argv's output (without the
// call's nonce) is only output.
func TestExecutorStatusOnlyFromTrailer(t *testing.T) {
	x, ctx := newExec(t)
	var out bytes.Buffer
	status, err := x.Exec(ctx, []string{"sh", "-c", `echo partial; kill -9 $PPID`}, nil, &out, 0)
	if !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("Exec of a killed script = status %d, %v; want unavailable", status, err)
	}
	out.Reset()
	status, err = x.Exec(ctx, []string{"sh", "-c", `echo runner-exit-00 0; printf 'runner-exit-00 0'; exit 5`}, nil, &out, 0)
	if err != nil || status != 5 || out.String() != "runner-exit-00 0\nrunner-exit-00 0" {
		t.Fatalf("Exec with a forged trailer = %d %q %v; want 5 and the forgery as output", status, out.String(), err)
	}
}

// TestExecutorStdinAndMissing: stdin arrives byte-exact (uploaded, not
// sent as the toolbox's newline-appending input), a missing program is
// status 127, and the call's files are removed.
func TestExecutorStdinAndMissing(t *testing.T) {
	x, ctx := newExec(t)
	in := "a\x00b\xff\n\x01\x01\x01no newline"
	var out bytes.Buffer
	status, err := x.Exec(ctx, []string{"od", "-An", "-c"}, bytes.NewReader([]byte(in)), &out, 0)
	var want bytes.Buffer
	cmd := execCommand("od", "-An", "-c")
	cmd.Stdin, cmd.Stdout = bytes.NewReader([]byte(in)), &want
	if cerr := cmd.Run(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil || status != 0 || out.String() != want.String() {
		t.Fatalf("od of stdin = %d %q %v; want %q", status, out.String(), err, want.String())
	}
	status, err = x.Exec(ctx, []string{"no-such-program-here"}, nil, io.Discard, 0)
	if err != nil || status != 127 {
		t.Fatalf("a missing program = %d %v, want 127", status, err)
	}
	out.Reset()
	if _, err := x.Exec(ctx, []string{"ls", "-A", DefaultIODir}, nil, &out, 0); err != nil || out.Len() != 0 {
		t.Fatalf("%s after calls holds %q (%v), want nothing", DefaultIODir, out.String(), err)
	}
}

// TestExecutorContextKills: when ctx ends, Exec returns promptly with
// ctx's error and the command dies with its session.
func TestExecutorContextKills(t *testing.T) {
	x, ctx := newExec(t)
	cctx, cancel := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := x.Exec(cctx, []string{"sh", "-c", `echo $$; exec sleep 60`}, nil, &out, 0)
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	var pid int
	for pid == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		pid = pidOf(out.String())
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec after cancel = %v, want context.Canceled", err)
	}
	if pid == 0 {
		t.Fatal("no pid printed")
	}
	for i := 0; ; i++ {
		if _, err := os.Stat("/proc/" + itoa(pid)); err != nil {
			break
		}
		if i > 200 {
			t.Fatalf("the command %d outlived its canceled Exec", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSweepDeletesStaleSessions: the executor's sessions older than
// staleSession (left by a driver that died mid-call) are deleted; fresh
// ones and sessions that are not the executor's are kept.
func TestSweepDeletesStaleSessions(t *testing.T) {
	x, ctx := newExec(t)
	old := sessionPrefix + "1000-aa"
	fresh := sessionPrefix + itoa(int(time.Now().Unix())) + "-bb"
	for _, id := range []string{old, fresh, "someone-else", sessionPrefix + "x"} {
		if err := x.tb.CreateSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	x.sweep(ctx, time.Now())
	l, err := x.tb.ListSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, s := range l {
		got[s.SessionID] = true
	}
	if got[old] || !got[fresh] || !got["someone-else"] || !got[sessionPrefix+"x"] || len(got) != 3 {
		t.Fatalf("sessions after a sweep = %v, want all but %s", got, old)
	}
}
