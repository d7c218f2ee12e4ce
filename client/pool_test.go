package client_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// TestPool drives two real daemons through one adapter: names carry their
// route, each sandbox lives on the runner its name names, and a listing
// spans both.
func TestPool(t *testing.T) {
	d1, d2 := startDaemon(t), startDaemon(t)
	ctx := context.Background()
	pool, err := client.NewPool(ctx, []client.Endpoint{
		{Name: "r1", URL: d1.url(), Token: d1.token},
		{Name: "r2", URL: d2.url(), Token: d2.token},
	}, client.AdapterOptions{Client: conformanceOptions})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	n1, n2 := pool.NewName("r1", "agent"), pool.NewName("r2", "agent")
	if !strings.HasPrefix(n1, "r1-agent-") || !strings.HasPrefix(n2, "r2-agent-") {
		t.Fatalf("NewName = %q, %q; want r1-agent-..., r2-agent-...", n1, n2)
	}
	h1, err := pool.Create(ctx, n1, adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h2, err := pool.Create(ctx, n2, adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Each lives on its own runner, and only there.
	for _, tc := range []struct {
		d     *daemon
		has   string
		hasnt string
	}{{d1, n1, n2}, {d2, n2, n1}} {
		c, err := client.New(tc.d.url(), tc.d.token, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.GetSandbox(ctx, tc.has); err != nil {
			t.Errorf("runner %s: GetSandbox(%s) = %v", tc.d.addr, tc.has, err)
		}
		if _, err := c.GetSandbox(ctx, tc.hasnt); !errors.Is(err, adapter.ErrNotFound) {
			t.Errorf("runner %s: GetSandbox(%s) = %v, want not_found", tc.d.addr, tc.hasnt, err)
		}
		c.Close()
	}
	r, err := pool.Exec(ctx, h2, adapter.Shell("echo on-r2"))
	if err != nil || strings.TrimSpace(string(r.Stdout)) != "on-r2" {
		t.Errorf("Exec on r2 = %q, %v", r.Stdout, err)
	}
	all, err := adapter.ListAll(ctx, pool, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, h := range all {
		seen[h.Name] = true
	}
	if !seen[n1] || !seen[n2] || len(all) != 2 {
		t.Errorf("ListAll = %v, want %s and %s", all, n1, n2)
	}
	// A sandbox made on r2 directly, under a name that routes nowhere in
	// this pool: the listing still shows it (a listing that hides one is
	// short), and its listed handle addresses r2.
	direct, err := client.New(d2.url(), d2.token, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.CreateSandbox(ctx, wire.CreateSandbox{Name: "foreign"}); err != nil {
		t.Fatal(err)
	}
	all, err = adapter.ListAll(ctx, pool, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	var foreign *adapter.Handle
	for i := range all {
		if all[i].Name == "foreign" {
			foreign = &all[i]
		}
	}
	if foreign == nil || len(all) != 3 {
		t.Fatalf("ListAll = %v, want %s, %s and foreign", all, n1, n2)
	}
	if err := pool.Destroy(ctx, *foreign); err != nil {
		t.Errorf("Destroy(listed foreign) = %v", err)
	}
	if _, err := direct.GetSandbox(ctx, "foreign"); !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("foreign after Destroy of its listed handle: %v, want not_found on r2", err)
	}
	for _, bad := range []string{"r3-agent", "agent", "r1"} {
		if _, err := pool.Create(ctx, bad, adapter.CreateOptions{}); !errors.Is(err, adapter.ErrInvalid) {
			t.Errorf("Create(%q) = %v, want invalid (no route)", bad, err)
		}
		if _, err := pool.Get(ctx, bad); !errors.Is(err, adapter.ErrInvalid) {
			t.Errorf("Get(%q) = %v, want invalid, never not_found", bad, err)
		}
	}
	// One runner down: its sandboxes are unavailable, never gone; the
	// other runner still answers; the listing is an error, not a short set.
	d1.signal(syscall.SIGSTOP)
	if _, err := pool.Get(ctx, n1); !adapter.Transient(err) {
		t.Errorf("Get on a stopped runner = %v, want transient", err)
	}
	if _, err := pool.Get(ctx, n2); err != nil {
		t.Errorf("Get on the live runner = %v", err)
	}
	if hs, err := adapter.ListAll(ctx, pool, 0, 0); err == nil {
		t.Errorf("ListAll with a runner down = %v, want an error", hs)
	}
	d1.signal(syscall.SIGCONT)
	for _, h := range []adapter.Handle{h1, h2} {
		if err := pool.Destroy(ctx, h); err != nil {
			t.Errorf("Destroy(%v) = %v", h, err)
		}
	}
}

// TestPoolConformance runs the whole suite through a pool of two daemons,
// with names minted alternately for each runner.
func TestPoolConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("the pool conformance run takes a minute")
	}
	d1, d2 := startDaemon(t), startDaemon(t)
	p1 := startProxy(t, d1.url())
	t.Cleanup(p1.close)
	var mu sync.Mutex
	n := 0
	conformance.Run(t, conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := client.NewPool(ctx, []client.Endpoint{
				{Name: "r1", URL: p1.url(), Token: d1.token},
				{Name: "r2", URL: d2.url(), Token: d2.token},
			}, client.AdapterOptions{Client: conformanceOptions})
			if err != nil {
				t.Fatalf("NewPool: %v", err)
			}
			t.Cleanup(func() { a.Close() })
			return conformance.Subject{
				Adapter: a,
				Outage: func() func() {
					d1.signal(syscall.SIGSTOP)
					d2.signal(syscall.SIGSTOP)
					return func() { d1.signal(syscall.SIGCONT); d2.signal(syscall.SIGCONT) }
				},
				InterruptList: p1.interruptList, // a listing visits r1 first
			}
		},
		NewName: func(t conformance.T) string {
			mu.Lock()
			n++
			r := []string{"r1", "r2"}[n%2]
			mu.Unlock()
			return client.NewName(r, "conf")
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  60 * time.Second,
	})
}
