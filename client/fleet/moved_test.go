package fleet_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/wire"
)

// TestMovedRoutes: a route set by a move sends a name to the runner it
// moved to (a call there, not to the runner its name names); while a move
// is marked the name answers unavailable, never not_found; a second mark
// of the same name is refused; a route back to the name's own runner is
// the default again.
func TestMovedRoutes(t *testing.T) {
	a, b := startDaemon(t), startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := fleet.New(ctx, fleet.Static{{Name: "ra", URL: a.url(), Token: a.token}, {Name: "rb", URL: b.url(), Token: b.token}}, fleet.Options{Refresh: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const name = "ra-moved"
	cb, err := p.Client("rb")
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox exists on rb only, as after a move.
	if _, err := cb.CreateSandbox(ctx, wire.CreateSandbox{Name: name}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, name); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Get before the route: got %v, want not_found from ra", err)
	}
	p.SetRoute(name, "rb")
	if r, ok := p.RunnerOf(name); !ok || r != "rb" {
		t.Fatalf("RunnerOf = %q, %v; want rb", r, ok)
	}
	if _, err := p.Get(ctx, name); err != nil {
		t.Fatalf("Get after the route: %v", err)
	}
	done, err := p.Moving(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Moving(name); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("a second Moving: got %v, want invalid", err)
	}
	if _, err := p.Get(ctx, name); !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("Get while moving: got %v, want unavailable", err)
	}
	done()
	if _, err := p.Get(ctx, name); err != nil {
		t.Fatalf("Get after the move: %v", err)
	}
	p.SetRoute(name, "ra")
	if r, _ := p.RunnerOf(name); r != "ra" {
		t.Fatalf("RunnerOf after a route back = %q, want ra", r)
	}
	if _, err := p.Client("nosuch"); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("Client of an unknown runner: got %v, want invalid", err)
	}
	if r, err := p.Pick(ctx, "ra"); err != nil || r != "rb" {
		t.Fatalf("Pick skipping ra = %q, %v; want rb", r, err)
	}
	if _, err := p.Pick(ctx, "ra", "rb"); !errors.Is(err, fleet.ErrExhausted) {
		t.Fatalf("Pick skipping both: got %v, want ErrExhausted", err)
	}
}
