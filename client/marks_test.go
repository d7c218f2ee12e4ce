package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// TestMarks reads a real session's marks: one per write a second or more
// apart, at the offsets written, in time order, from the mark covering
// the asked byte; a bad stream is adapter.ErrInvalid and a negative from
// is refused before any request.
func TestMarks(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	c := newClient(t, d, d.url())
	if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "marks"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.CreateSession(ctx, "marks", wire.CreateSession{ID: "s", Argv: []string{"sh", "-c", "printf one; sleep 1.3; printf two"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := c.Session(ctx, "marks", "s")
		if err != nil {
			t.Fatal(err)
		}
		if s.State != wire.SessionRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("session never ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	m, err := c.Marks(ctx, "marks", "s", "stdout", 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Marks) != 1 || m.Marks[0].Offset != 3 || m.Next != nil {
		t.Fatalf("from 4: got %+v, want the one mark at 3", m)
	}
	all, err := c.Marks(ctx, "marks", "s", "stdout", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Marks) != 2 || all.Marks[0].Offset != 0 || all.Marks[1].Offset != 3 {
		t.Fatalf("from 0: got %+v, want marks at 0 and 3", all)
	}
	if gap := all.Marks[1].Time.Sub(all.Marks[0].Time); gap < wire.SinceGranularity || gap > 5*time.Second {
		t.Errorf("marks %v apart, want at least the granularity (the writes were 1.3 s apart)", gap)
	}
	if _, err := c.Marks(ctx, "marks", "s", "stdin", 0); !errors.Is(err, adapter.ErrInvalid) {
		t.Errorf("stream stdin: got %v, want ErrInvalid", err)
	}
	if _, err := c.Marks(ctx, "marks", "s", "stdout", -1); !errors.Is(err, adapter.ErrInvalid) {
		t.Errorf("from -1: got %v, want ErrInvalid", err)
	}
}
