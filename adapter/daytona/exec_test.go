package daytona

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/guest"
	"github.com/agentrunner/runner/adapter/hosted"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona/daytonatest"
)

// newExec returns the executor of a fresh started sandbox in a stand-in.
func newExec(t *testing.T) (*sessionExec, context.Context) {
	x, ctx, _ := newExecIn(t, daytonatest.Options{})
	return x, ctx
}

// newExecIn is newExec with the stand-in's options, and the stand-in.
func newExecIn(t *testing.T, opts daytonatest.Options) (*sessionExec, context.Context, *daytonatest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	srv := daytonatest.New(t, opts)
	c, err := New(Config{APIKey: NewSecret(srv.APIKey), APIURL: srv.URL(), PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAdapter(AdapterConfig{Client: c, Config: hosted.Config{Version: "v0"}})
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
	x := &sessionExec{a: a, id: sb.ID, tb: tb}
	t.Cleanup(x.Close)
	return x, ctx, srv
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

// TestExitCodeRaceForced: with the stand-in answering the daemon's 500
// for an exit code file met empty on a tenth of the command reads, 300 calls
// all end with their status and no error: the read is retried.
// Without the retry (Toolbox.Command reading once) the first race fails
// its call as a provider error.
func TestExitCodeRaceForced(t *testing.T) {
	x, ctx, srv := newExecIn(t, daytonatest.Options{})
	srv.SetExitCodeRace(0.1)
	x.a.cfg.PollInterval = 2 * time.Millisecond // more reads of the record per call
	// 300 calls, four at a time (each worker has a pooled session).
	errs := make(chan error, 300)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 300; i += 4 {
				// A pause, so the call polls the command record while it runs.
				status, err := x.Exec(ctx, []string{"sh", "-c", "sleep 0.01; exit " + itoa(i%3)}, nil, io.Discard, time.Minute)
				if err != nil || status != i%3 {
					errs <- fmt.Errorf("call %d = %d, %v; want %d", i, status, err, i%3)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("%v (after %d forced races)", err, srv.ExitCodeRaces())
	}
	if n := srv.ExitCodeRaces(); n < 30 {
		t.Fatalf("the stand-in forced %d races: too few for the test to prove anything", n)
	}
}

// TestCallDoesNotWaitForDelete: with the stand-in's DELETE made slow (a
// termination check every 700 ms), a call through the session pool
// takes far less, while a call with a session of its own, deleted on its
// path, waits for the DELETE.
func TestCallDoesNotWaitForDelete(t *testing.T) {
	x, ctx, _ := newExecIn(t, daytonatest.Options{TerminationCheck: 700 * time.Millisecond})
	call := func() time.Duration {
		start := time.Now()
		if status, err := x.Exec(ctx, []string{"true"}, nil, io.Discard, time.Minute); err != nil || status != 0 {
			t.Fatalf("call = %d, %v", status, err)
		}
		return time.Since(start)
	}
	call() // creates the session the next calls reuse
	for range 3 {
		if d := call(); d >= 700*time.Millisecond {
			t.Fatalf("a pooled call took %v: it waited for a DELETE", d)
		}
	}
	x.perCall = true
	if d := call(); d < 700*time.Millisecond {
		t.Fatalf("a per-call session's call took %v, want at least the DELETE's 700 ms (the baseline is wrong)", d)
	}
}

// TestShellKilledCallBounded: the OOM killer takes the session's shell and
// its command mid-call: the daemon never records an exit code, so the
// call ends once its lifetime (plus noStatusMargin) passed, as
// unavailable wrapping guest.ErrNoStatus, with what arrived; it never
// invents a status. The next call works (the dead session is not
// reused). Without the bound the call polls until ctx ends.
func TestShellKilledCallBounded(t *testing.T) {
	x, ctx, srv := newExecIn(t, daytonatest.Options{})
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var out syncBuffer
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := x.Exec(cctx, []string{"sh", "-c", "echo started; exec sleep 60"}, nil, &out, time.Second)
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); out.String() == ""; {
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	l, err := x.tb.ListSessions(ctx)
	if err != nil || len(l) != 1 {
		t.Fatalf("sessions = %v, %v; want the call's one", l, err)
	}
	if !srv.OOMKillSession(x.id, l[0].SessionID) {
		t.Fatal("no such session")
	}
	err = <-done
	if !errors.Is(err, guest.ErrNoStatus) || !errors.Is(err, adapter.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec whose shell was killed = %v; want unavailable wrapping ErrNoStatus, before ctx ended", err)
	}
	if d := time.Since(start); d > time.Second+noStatusMargin+3*time.Second {
		t.Fatalf("it took %v", d)
	}
	if out.String() != "started\n" {
		t.Fatalf("stdout = %q, want what arrived", out.String())
	}
	if status, err := x.Exec(ctx, []string{"true"}, nil, io.Discard, time.Minute); err != nil || status != 0 {
		t.Fatalf("the next call = %d, %v", status, err)
	}
}

// TestDeadIdleSessionReplaced: an idle pooled session whose shell died
// (the exec answers the daemon's 500 "broken pipe") is replaced by a
// fresh one and the call runs once. Without the retry the call fails.
func TestDeadIdleSessionReplaced(t *testing.T) {
	x, ctx, srv := newExecIn(t, daytonatest.Options{})
	if _, err := x.Exec(ctx, []string{"true"}, nil, io.Discard, time.Minute); err != nil {
		t.Fatal(err)
	}
	x.mu.Lock()
	if len(x.idle) != 1 {
		x.mu.Unlock()
		t.Fatalf("idle sessions = %d, want 1", len(x.idle))
	}
	idle := x.idle[0].id
	x.mu.Unlock()
	srv.OOMKillSession(x.id, idle)
	time.Sleep(100 * time.Millisecond)
	var out bytes.Buffer
	status, err := x.Exec(ctx, []string{"sh", "-c", "echo once >> ran; cat ran"}, nil, &out, time.Minute)
	if err != nil || status != 0 || out.String() != "once\n" {
		t.Fatalf("call on a dead idle session = %d %q %v; want it run once on a fresh one", status, out.String(), err)
	}
}

// TestCloseDeletesIdleSessions: Close deletes the pool's sessions and
// waits for the deletes.
func TestCloseDeletesIdleSessions(t *testing.T) {
	x, ctx, _ := newExecIn(t, daytonatest.Options{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.Exec(ctx, []string{"sleep", "0.2"}, nil, io.Discard, time.Minute)
		}()
	}
	wg.Wait()
	if l, err := x.tb.ListSessions(ctx); err != nil || len(l) != 3 {
		t.Fatalf("sessions before Close = %d, %v; want 3 idle", len(l), err)
	}
	x.Close()
	if l, err := x.tb.ListSessions(ctx); err != nil || len(l) != 0 {
		t.Fatalf("sessions after Close = %v, %v; want none", l, err)
	}
}
