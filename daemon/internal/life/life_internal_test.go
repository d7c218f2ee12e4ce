package life

import (
	"context"
	"testing"
	"time"
)

// TestUntilStop: the context untilStop returns ends when the server's
// lifetime does, and also when its own cancel or its parent ends it,
// without ending the lifetime.
func TestUntilStop(t *testing.T) {
	life, endLife := context.WithCancel(context.Background())
	defer endLife()
	s := &Life{ctx: life, end: endLife}

	ctx, cancel := s.UntilStop(context.Background())
	cancel()
	if ctx.Err() == nil {
		t.Fatal("after its cancel: ctx not done")
	}
	parent, cancelParent := context.WithCancel(context.Background())
	ctx, cancel = s.UntilStop(parent)
	defer cancel()
	cancelParent()
	if ctx.Err() == nil {
		t.Fatal("after its parent ended: ctx not done")
	}
	if life.Err() != nil {
		t.Fatal("a request's context ended the server's lifetime")
	}

	ctx, cancel = s.UntilStop(context.Background())
	defer cancel()
	s.BeginStop()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("after beginStop: ctx not done within 5s")
	}
	if _, ok := s.Track(); ok {
		t.Error("track after beginStop: got ok, want refused")
	}
}
