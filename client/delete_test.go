package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// TestDeleteSession: DeleteSession refuses a running session with the
// invalid kind, removes an ended one (a later Session is not_found), and
// answers nil for one that is already gone.
func TestDeleteSession(t *testing.T) {
	d := startDaemon(t)
	c := newClient(t, d, d.url())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "del"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSandbox(context.Background(), "del") })
	s, _, err := c.CreateSession(ctx, "del", wire.CreateSession{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSession(ctx, "del", s.ID); adapter.KindOf(err) != adapter.KindInvalid {
		t.Fatalf("delete a running session: got %v (kind %q), want kind invalid", err, adapter.KindOf(err))
	}
	if _, err := c.Terminate(ctx, "del", s.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSession(ctx, "del", s.ID); err != nil {
		t.Fatalf("delete an ended session: got %v, want nil", err)
	}
	if _, err := c.Session(ctx, "del", s.ID); adapter.KindOf(err) != adapter.KindNotFound {
		t.Fatalf("session after the delete: got %v, want not_found", err)
	}
	if err := c.DeleteSession(ctx, "del", s.ID); err != nil {
		t.Fatalf("delete again: got %v, want nil", err)
	}
}
