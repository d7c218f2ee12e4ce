package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

var testOptions = client.Options{
	ConnectTimeout:   2e9,
	RequestTimeout:   5e9,
	HeartbeatTimeout: 60e9,
	ExecLiveness:     1e9,
}

func newClient(t *testing.T, d *daemon) *client.Client {
	t.Helper()
	c, err := client.New(d.url(), d.token, testOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wantExhausted fails t unless err is runnerd's 503 unavailable with
// exhausted set.
func wantExhausted(t *testing.T, what string, err error) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || !ae.Exhausted || ae.Status != http.StatusServiceUnavailable ||
		ae.Code != wire.CodeUnavailable || !errors.Is(err, adapter.ErrUnavailable) || ae.Uncertain {
		t.Fatalf("%s = %v (%#v), want 503 unavailable with exhausted", what, err, ae)
	}
}

// TestCapacity: GET /v1/capacity reports what the host holds and its
// bounds; a create beyond --max-sandboxes or --max-sessions is answered
// 503 unavailable with exhausted; an idempotent re-create of what exists
// is not refused.
func TestCapacity(t *testing.T) {
	d := startDaemon(t, "--netpolicy", "off", "--max-sandboxes", "2", "--max-sessions", "1")
	t.Cleanup(d.stop)
	c := newClient(t, d)
	ctx := context.Background()
	cp, err := c.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Sandboxes != 0 || cp.MaxSandboxes != 2 || cp.Sessions != 0 || cp.MaxSessions != 1 || cp.Exhausted {
		t.Fatalf("capacity of an empty host = %+v", cp)
	}
	if cp.MemoryAvailableBytes <= 0 || cp.PIDsFree <= 0 {
		t.Errorf("capacity memory %d, pids %d: want both > 0", cp.MemoryAvailableBytes, cp.PIDsFree)
	}
	for _, n := range []string{"a", "b"} {
		if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: n}); err != nil {
			t.Fatalf("create %s: %v", n, err)
		}
	}
	_, err = c.CreateSandbox(ctx, wire.CreateSandbox{Name: "c"})
	wantExhausted(t, "third create", err)
	if _, err := c.GetSandbox(ctx, "c"); !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("refused sandbox: Get = %v, want not_found (nothing created)", err)
	}
	if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "a"}); err != nil {
		t.Errorf("idempotent re-create of a on a full host = %v, want its sandbox", err)
	}
	cp, err = c.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cp.Sandboxes != 2 || !cp.Exhausted {
		t.Errorf("capacity of a full host = %+v, want 2 sandboxes, exhausted", cp)
	}
	// Sessions: one runs; a second is refused, a retry of the first is not.
	first := wire.CreateSession{ID: "s1", Argv: []string{"sleep", "60"}}
	if _, _, err := c.CreateSession(ctx, "a", first); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.CreateSession(ctx, "b", wire.CreateSession{ID: "s2", Argv: []string{"sleep", "60"}})
	wantExhausted(t, "second session", err)
	if _, _, err := c.CreateSession(ctx, "a", first); err != nil {
		t.Errorf("idempotent re-create of s1 = %v", err)
	}
	if cp, err = c.Capacity(ctx); err != nil || cp.Sessions != 1 {
		t.Errorf("capacity = %+v, %v; want 1 session", cp, err)
	}
	// Destroying a sandbox frees its place.
	if err := c.DeleteSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "c"}); err != nil {
		t.Errorf("create after a destroy freed a place: %v", err)
	}
}

// TestCapacityConcurrent: concurrent creates never together pass the
// bound (the admission counts creates in flight, not only the registry).
func TestCapacityConcurrent(t *testing.T) {
	d := startDaemon(t, "--netpolicy", "off", "--max-sandboxes", "5")
	t.Cleanup(d.stop)
	c := newClient(t, d)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, full := 0, 0
	for i := range 24 {
		wg.Go(func() {
			_, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: fmt.Sprintf("s%d", i)})
			var ae *client.APIError
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.As(err, &ae) && ae.Exhausted:
				full++
			default:
				t.Errorf("create s%d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if ok != 5 || full != 19 {
		t.Errorf("24 concurrent creates under --max-sandboxes 5: %d created, %d exhausted; want 5 and 19", ok, full)
	}
	l, err := c.ListSandboxes(ctx, 100, "")
	if err != nil || len(l.Sandboxes) != 5 {
		t.Errorf("listing = %d sandboxes, %v; want 5", len(l.Sandboxes), err)
	}
}
