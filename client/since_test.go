package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// TestSince reads a real session from a time: StreamSince's body starts
// where the time resolved to and says so (Start), AttachSince learns each
// stream's start from its first frame, and Reattach after a daemon restart
// continues by cursor (a reattach by time would replay "b") while a stream
// it never saw a byte of is still asked by time.
func TestSince(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	c := newClient(t, d, d.url())
	if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "since"}); err != nil {
		t.Fatal(err)
	}
	script := `printf a; printf x >&2; sleep 2.5; printf b; while [ ! -e go ]; do sleep 0.05; done; printf c; printf yz >&2`
	if _, _, err := c.CreateSession(ctx, "since", wire.CreateSession{ID: "s", Argv: []string{"sh", "-c", script}}); err != nil {
		t.Fatal(err)
	}
	readAll := func(b *client.StreamBody, err error) (string, *client.StreamBody) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		got, err := io.ReadAll(b)
		if err != nil {
			t.Fatal(err)
		}
		return string(got), b
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := readAll(c.Stream(ctx, "since", "s", "stdout", 0, false)); got == "a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no output")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mid := time.Now().Add(1200 * time.Millisecond) // > 1 s after "a", well before "b"
	time.Sleep(time.Until(mid) + 1500*time.Millisecond)

	for _, tt := range []struct {
		name      string
		since     time.Time
		stream    string
		want      string
		wantStart int64
	}{
		{"stdout since between a and b", mid, "stdout", "b", 1},
		{"stdout since an hour ago", time.Now().Add(-time.Hour), "stdout", "ab", 0},
		{"stderr since between", mid, "stderr", "", 1},
		{"stdout since the future", time.Now().Add(time.Hour), "stdout", "", 2},
	} {
		got, b := readAll(c.StreamSince(ctx, "since", "s", tt.stream, tt.since, false))
		if got != tt.want || b.Start() != tt.wantStart {
			t.Errorf("%s: got %q from %d, want %q from %d", tt.name, got, b.Start(), tt.want, tt.wantStart)
		}
	}
	if _, b := readAll(c.Stream(ctx, "since", "s", "stdout", 1, false)); b.Start() != 1 {
		t.Errorf("Stream from cursor 1: Start %d, want 1", b.Start())
	}

	fr, err := c.AttachSince(ctx, "since", "s", mid)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fr.Next()
	if err != nil || f.Kind != wire.FrameData || f.Stream != wire.StreamStdout || f.Offset != 1 || string(f.Payload) != "b" {
		t.Fatalf("first frame: %+v, %v; want stdout data \"b\" at 1", f, err)
	}
	if off, ok := fr.Start(wire.StreamStdout); off != 1 || !ok {
		t.Errorf("Start(stdout) = %d, %v; want 1, true", off, ok)
	}
	if off, ok := fr.Start(wire.StreamStderr); ok {
		t.Errorf("Start(stderr) = %d, %v before any stderr frame; want unknown", off, ok)
	}
	d.kill9()
	if _, err := fr.Next(); !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("Next after runnerd died: %v, want unavailable", err)
	}
	fr.Close()
	d.restart(t)
	fr2, err := c.Reattach(ctx, "since", "s", fr)
	if err != nil {
		t.Fatal(err)
	}
	defer fr2.Close()
	if _, err := c.Exec(ctx, "since", wire.Exec{Argv: []string{"touch", "go"}}); err != nil {
		t.Fatal(err)
	}
	got := map[wire.StreamID]string{}
	for {
		f, err := fr2.Next()
		if err != nil {
			t.Fatalf("Next after Reattach: %v (got %q so far)", err, got)
		}
		if f.Kind.Terminal() {
			if f.Kind != wire.FrameExit {
				t.Fatalf("terminal frame %v, want exit", f.Kind)
			}
			break
		}
		if len(got[f.Stream]) == 0 {
			if want := map[wire.StreamID]int64{wire.StreamStdout: 2, wire.StreamStderr: 1}[f.Stream]; f.Offset != want {
				t.Errorf("first %s frame after Reattach at offset %d, want %d", f.Stream.StreamName(), f.Offset, want)
			}
		}
		got[f.Stream] += string(f.Payload)
	}
	if got[wire.StreamStdout] != "c" || got[wire.StreamStderr] != "yz" {
		t.Errorf("after Reattach: stdout %q stderr %q; want c, yz", got[wire.StreamStdout], got[wire.StreamStderr])
	}
	if cur := fr2.Cursors(); cur != (client.Cursors{Stdout: 3, Stderr: 3}) {
		t.Errorf("Cursors = %+v, want {3 3}", cur)
	}
	if off, ok := fr2.Start(wire.StreamStderr); off != 1 || !ok {
		t.Errorf("Start(stderr) after Reattach = %d, %v; want 1, true", off, ok)
	}
}

// TestStreamStartHeader: a since read must learn its start from
// Runner-Stream-Start (without it no cursor could be kept), and a cursor
// read told another start than its cursor is not trusted either.
func TestStreamStartHeader(t *testing.T) {
	answer := func(start string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Content-Type", "application/octet-stream")
			if start != "" {
				h.Set(wire.HeaderStreamStart, start)
			}
			h.Set(wire.HeaderStreamEnd, "exit")
			h.Set(wire.HeaderExit, exitJSON(t, wire.ExitExited, 0))
			h.Set("Content-Length", "1")
			w.WriteHeader(200)
			io.WriteString(w, "b")
		}
	}
	since := time.Now()
	for _, tt := range []struct {
		name      string
		start     string
		bySince   bool
		wantStart int64 // -1: the open must fail as unavailable
	}{
		{"since with start", "7", true, 7},
		{"since without start", "", true, -1},
		{"since with a malformed start", "x", true, -1},
		{"since with a negative start", "-1", true, -1},
		{"cursor without start", "", false, 3},
		{"cursor with its start", "3", false, 3},
		{"cursor told another start", "5", false, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestClient(t, serve(t, answer(tt.start)))
			var b *client.StreamBody
			var err error
			if tt.bySince {
				b, err = c.StreamSince(context.Background(), "box", "s1", "stdout", since, false)
			} else {
				b, err = c.Stream(context.Background(), "box", "s1", "stdout", 3, false)
			}
			if tt.wantStart < 0 {
				if !errors.Is(err, adapter.ErrUnavailable) {
					t.Fatalf("got %v, want unavailable", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if b.Start() != tt.wantStart {
				t.Errorf("Start: got %d, want %d", b.Start(), tt.wantStart)
			}
		})
	}
}
