package sprites_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// These tests reproduce Sprites as its clients and docs describe it
// (issue 31, items 1-6): each failed against the adapter before the fix
// named in its comment.

// TestNoCloseStall: the server holds an exec's socket 5 s after the exit
// byte before it answers a close (sprites-py #24, #26; sprites-js #16).
// A call must not wait for that answer: before the fix, Session.Close
// waited the whole hold and Run took 5.0 s.
func TestNoCloseStall(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{CloseHold: 5 * time.Second})
	ctx := ctxT(t)
	if _, err := c.Create(ctx, sprites.CreateRequest{Name: "stall"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r, err := c.Run(ctx, "stall", sprites.ExecOptions{Argv: []string{"echo", "hi"}}, nil)
	if d := time.Since(start); err != nil || string(r.Stdout) != "hi\n" || d > 2*time.Second {
		t.Fatalf("run: %q exit %d, %v in %v; want hi, 0, well under the 5 s hold", r.Stdout, r.ExitCode, err, d)
	}
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "stall-shim")
	start = time.Now()
	for range 3 {
		if _, err := a.Sessions(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("three runner-shim calls took %v, want no 5 s hold each", d)
	}
	_ = srv
}

// TestTextExitIsNotTheEnd: a non-TTY exec gets the JSON exit message
// before its last output (the asyncapi's ExitMessage; a field capture saw
// it before the binary exit frame). Before the fix the decoder ended the
// call there: the output after it (runner-shim's answer) was lost.
func TestTextExitIsNotTheEnd(t *testing.T) {
	_, c := standIn(t, spritestest.Options{CloseHold: -1})
	ctx := ctxT(t)
	if _, err := c.Create(ctx, sprites.CreateRequest{Name: "text-exit"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r, err := c.Run(ctx, "text-exit", sprites.ExecOptions{Argv: []string{"/bin/sh", "-c", `echo '{"answer":1}'; exit 7`}}, nil)
		if err != nil || string(r.Stdout) != "{\"answer\":1}\n" || r.ExitCode != 7 {
			t.Fatalf("run %d: %q exit %d, %v; want the answer and exit 7 (the binary frame's)", i, r.Stdout, r.ExitCode, err)
		}
	}
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "text-exit-shim")
	res, err := a.Exec(ctx, h, adapter.Shell("printf out; exit 4"))
	if err != nil || string(res.Stdout) != "out" || res.Exit.Code != 4 {
		t.Errorf("exec: %q %v, %v; want out, exit 4", res.Stdout, res.Exit, err)
	}
}

// TestLostOutput: fast commands lose their whole output (sprites-py #16)
// or get it replayed with stderr merged into stdout, capped at 64 KiB (a
// field capture). Before the fix an exit without an answer was a
// provider error, and merged stderr after the answer hid it.
func TestLostOutput(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{DropExit: spritestest.DropExitRandom, LoseOutput: true, Seed: 31, CloseHold: -1})
	a := newAdapter(t, c, nil)
	ctx := ctxT(t)
	h := hostedtest.Create(t, ctx, a, "lossy")
	for i := range 12 {
		res, err := a.Exec(ctx, h, adapter.Shell("echo out; echo err >&2; exit 5"))
		if err != nil || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.Exit.Code != 5 {
			t.Fatalf("exec %d: %q %q %v, %v; want out, err, exit 5", i, res.Stdout, res.Stderr, res.Exit, err)
		}
	}
	if _, err := a.Sessions(ctx, h); err != nil {
		t.Fatalf("sessions: %v", err)
	}
	if srv.LostOutputs() == 0 {
		t.Errorf("no exec lost its output: the run did not exercise the quirk")
	}
	t.Logf("%d execs lost or replayed their output", srv.LostOutputs())
}

// TestUploadWhereTheUserMayWrite: fs/write runs as the sprite user, so
// /usr/local/bin is refused (403). The default path is in the user's
// home; a refused upload is a provider error and Create leaves no sprite
// behind. Before the fix the 403 was denied and the sprite stayed.
func TestUploadWhereTheUserMayWrite(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{CloseHold: -1})
	ctx := ctxT(t)
	if _, err := newAdapter(t, c, nil).Create(ctx, "home-shim", adapter.CreateOptions{}); err != nil {
		t.Fatalf("create with the default shim path: %v", err)
	}
	sys := newAdapter(t, c, func(cfg *sprites.AdapterConfig) { cfg.Shim = "/usr/local/bin/runner-shim" })
	_, err := sys.Create(ctx, "sys-shim", adapter.CreateOptions{})
	if !errors.Is(err, adapter.ErrProvider) || !errors.Is(err, sprites.ErrWriteDenied) {
		t.Errorf("create with /usr/local/bin: %v, want provider wrapping ErrWriteDenied", err)
	}
	if _, ok := srv.Dir("sys-shim"); ok {
		t.Error("the failed create left its sprite behind")
	}
}

// TestNotReadyAtOnce: a new sprite refuses execs and fs calls for a while
// (the stand-in's model: 503). Create waits for it; before the fix the
// upload's 503 failed the create.
func TestNotReadyAtOnce(t *testing.T) {
	_, c := standIn(t, spritestest.Options{ReadyDelay: 1500 * time.Millisecond, CloseHold: -1})
	a := newAdapter(t, c, nil)
	ctx := ctxT(t)
	start := time.Now()
	h, err := a.Create(ctx, "slow-start", adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if d := time.Since(start); d < 1400*time.Millisecond {
		t.Errorf("create returned in %v, before the sprite was ready", d)
	}
	if res, err := a.Exec(ctx, h, adapter.Shell("echo up")); err != nil || string(res.Stdout) != "up\n" {
		t.Errorf("exec after create: %q, %v", res.Stdout, err)
	}
}

// TestSessionAcrossIdleness: a sprite pauses after its last exec (warm:
// frozen) and then goes cold (killed); a detached runner-shim session
// runs outside any exec, so only the task runner-shim holds keeps the
// sprite up. The session ends with its true exit and every byte. Before
// the fix (no hold) the session was frozen, then killed: lost.
func TestSessionAcrossIdleness(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{IdleAfter: 700 * time.Millisecond, ColdAfter: 700 * time.Millisecond, CloseHold: -1})
	a := newAdapter(t, c, nil)
	ctx := ctxT(t)
	h := hostedtest.Create(t, ctx, a, "idle")
	st, err := a.Spawn(ctx, h, adapter.Shell(`for i in 1 2 3 4 5 6 7 8; do echo "tick $i"; sleep 0.5; done; exit 9`), adapter.SpawnOptions{SessionID: "long"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close() // detached: no exec of ours keeps the sprite up
	start := time.Now()
	held := false
	for time.Since(start) < 15*time.Second {
		tasks := srv.Tasks("idle")
		if len(tasks) == 0 {
			break
		}
		held = held || len(tasks) == 1 && strings.Contains(tasks[0], "long")
		if state := srv.State("idle"); state != "running" {
			t.Fatalf("sprite %s %v after the spawn while its session runs, tasks %v", state, time.Since(start), tasks)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(start); !held || d < 3*time.Second {
		t.Errorf("runner-shim's task held the sprite %v (seen: %v), want the session's ~4 s, far past the 0.7 s idle time", d, held)
	}
	// Idle again once the command ended: the hold was released, and the
	// sprite goes warm, then cold (every process killed) before we look.
	deadline := time.Now().Add(10 * time.Second)
	for srv.State("idle") != "cold" && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if srv.State("idle") != "cold" {
		t.Errorf("the sprite is %s, not cold, long after the session ended: the task was not released", srv.State("idle"))
	}
	st, err = a.Attach(ctx, h, "long", adapter.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	out, _, end := readAll(t, st)
	var want bytes.Buffer
	for i := 1; i <= 8; i++ {
		want.WriteString("tick " + string(rune('0'+i)) + "\n")
	}
	if !bytes.Equal(out, want.Bytes()) || end.Exit == nil || end.Exit.Code != 9 {
		t.Errorf("session: %q, end %+v; want 8 ticks and exit 9", out, end)
	}
}

// TestLargeListSurvivesReplayCap: a fast exec's output replayed with
// stderr merged and capped at 64 KiB (a field capture) cuts a listing of
// many sessions on every run. runner-shim list is paged (--max-bytes,
// --after) under the cap and the pages joined; before, Sessions failed
// after four cut answers.
func TestLargeListSurvivesReplayCap(t *testing.T) {
	_, c := standIn(t, spritestest.Options{ReplayFast: true, CloseHold: -1})
	a := newAdapter(t, c, nil)
	ctx := ctxT(t)
	h := hostedtest.Create(t, ctx, a, "many")
	pad := strings.Repeat("x", 3000)
	const n = 30 // ~3 KiB of argv each: ~96 KiB of listing
	for i := range n {
		st, err := a.Spawn(ctx, h, adapter.Command{Path: "true", Args: []string{pad}}, adapter.SpawnOptions{SessionID: fmt.Sprintf("s%02d", i)})
		if err != nil {
			t.Fatalf("spawn %d: %v", i, err)
		}
		st.Close()
	}
	list, err := a.Sessions(ctx, h)
	if err != nil || len(list) != n {
		t.Fatalf("sessions: %d, %v; want %d", len(list), err, n)
	}
	for i, s := range list {
		if s.ID != fmt.Sprintf("s%02d", i) || len(s.Command.Args) != 1 || s.Command.Args[0] != pad {
			t.Errorf("session %d: %s %d args, want s%02d in start order with its argv whole", i, s.ID, len(s.Command.Args), i)
		}
	}
}
