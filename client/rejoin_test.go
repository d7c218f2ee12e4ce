package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// readUntil reads frames into got until stop holds or the stream ends; it
// returns the terminal frame, if any.
func readUntil(t *testing.T, st adapter.Stream, cur *adapter.Cursor, got *bytes.Buffer, stop func() bool) *adapter.Frame {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for !stop() {
		select {
		case f, ok := <-st.Frames():
			if !ok {
				return nil
			}
			if f.Terminal() {
				return &f
			}
			if f.Stream == adapter.Stdout {
				if f.Offset != cur.Stdout {
					t.Fatalf("frame at offset %d, want %d", f.Offset, cur.Stdout)
				}
				got.Write(f.Data)
			}
			cur.Advance(f)
		case <-timeout:
			t.Fatalf("no frame for 30s (have %q)", got.String())
		}
	}
	return nil
}

// TestRejoinAcrossDaemonKill: a session keeps writing while runnerd is
// killed with SIGKILL and restarted. The attached stream ends with a
// transport error (never an exit); attaching again from the cursor the
// reader persisted gives the rest, and the two reads joined are
// byte-identical to one read from byte zero. A second stream with a
// ReattachWindow rides through the restart on its own.
func TestRejoinAcrossDaemonKill(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	c := newClient(t, d, d.url())
	plain, err := client.NewAdapter(ctx, c, client.AdapterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	riding, err := client.NewAdapter(ctx, c, client.AdapterOptions{ReattachWindow: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h, err := plain.Create(ctx, "rejoin-1", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Destroy(ctx, h)
	// 400 numbered lines, 5 ms apart: it runs across the kill.
	st, err := plain.Spawn(ctx, h, adapter.Shell(`i=0; while [ $i -lt 400 ]; do echo "line $i"; i=$((i+1)); sleep 0.005; done; exit 7`), adapter.SpawnOptions{SessionID: "writer"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rst, err := riding.Attach(ctx, h, "writer", adapter.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	defer rst.Close()

	var first bytes.Buffer
	var cur adapter.Cursor
	readUntil(t, st, &cur, &first, func() bool { return bytes.Contains(first.Bytes(), []byte("line 20\n")) })
	d.kill9()
	// Drain what was in flight; the stream must end with a transport error.
	term := readUntil(t, st, &cur, &first, func() bool { return false })
	if term == nil || term.Exit != nil || !errors.Is(term.Err, adapter.ErrUnavailable) {
		t.Fatalf("stream across a daemon kill ended with %v, want a transport (unavailable) error, never an exit", term)
	}
	time.Sleep(300 * time.Millisecond) // the session keeps writing while runnerd is down
	d.restart(t)

	again, err := plain.Attach(ctx, h, "writer", cur)
	if err != nil {
		t.Fatalf("Attach from %+v after the restart = %v", cur, err)
	}
	defer again.Close()
	var second bytes.Buffer
	term = readUntil(t, again, &cur, &second, func() bool { return false })
	if term == nil || term.Exit == nil || term.Exit.Code != 7 || term.Exit.Reason != adapter.ReasonExited {
		t.Fatalf("rejoined stream ended with %v, want exited 7", term)
	}

	whole, err := plain.Attach(ctx, h, "writer", adapter.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	var all bytes.Buffer
	var zero adapter.Cursor
	readUntil(t, whole, &zero, &all, func() bool { return false })
	var want bytes.Buffer
	for i := range 400 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if joined := append(first.Bytes(), second.Bytes()...); !bytes.Equal(joined, all.Bytes()) || !bytes.Equal(all.Bytes(), want.Bytes()) {
		t.Errorf("before-kill read (%d bytes) + rejoined read (%d bytes) != replay from zero (%d bytes) or != the 400 lines", first.Len(), second.Len(), all.Len())
	}

	var ridden bytes.Buffer
	var rcur adapter.Cursor
	term = readUntil(t, rst, &rcur, &ridden, func() bool { return false })
	if term == nil || term.Exit == nil || term.Exit.Code != 7 {
		t.Fatalf("reattaching stream ended with %v, want exited 7", term)
	}
	if !bytes.Equal(ridden.Bytes(), want.Bytes()) {
		t.Errorf("reattaching stream read %d bytes, want the %d bytes of one uninterrupted read", ridden.Len(), want.Len())
	}
}

// TestTerminatedReason: a session stopped through the adapter reports
// ReasonTerminated; one killed by a signal nobody asked the adapter to send
// reports ReasonSignaled with Code -1 and the signal's name.
func TestTerminatedReason(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	c := newClient(t, d, d.url())
	a, err := client.NewAdapter(ctx, c, client.AdapterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := a.Create(ctx, "reasons", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy(ctx, h)
	st, err := a.Spawn(ctx, h, adapter.Shell("echo ready; exec sleep 60"), adapter.SpawnOptions{SessionID: "killed"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := c.Signal(ctx, "reasons", "killed", "KILL"); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	var cur adapter.Cursor
	term := readUntil(t, st, &cur, &got, func() bool { return false })
	want := adapter.Exit{Code: -1, Signal: "SIGKILL", Reason: adapter.ReasonSignaled}
	if term == nil || term.Exit == nil || *term.Exit != want {
		t.Errorf("killed session ended with %v, want %v", term, want)
	}
	st2, err := a.Spawn(ctx, h, adapter.Shell("exec sleep 60"), adapter.SpawnOptions{SessionID: "parked"})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if err := a.Suspend(ctx, h); err != nil {
		t.Fatal(err)
	}
	var cur2 adapter.Cursor
	term = readUntil(t, st2, &cur2, &got, func() bool { return false })
	if term == nil || term.Exit == nil || term.Exit.Reason != adapter.ReasonTerminated || term.Exit.Signal != "SIGTERM" || term.Exit.Code != -1 {
		t.Errorf("suspended session ended with %v, want terminated by SIGTERM", term)
	}
}
