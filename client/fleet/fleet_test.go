package fleet_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/client/fleet"
	"github.com/agentrunner/runner/wire"
)

// mutable is a Discovery whose list the test changes.
type mutable struct {
	mu sync.Mutex // guards rs
	rs []fleet.Runner
}

func (m *mutable) Runners(context.Context) ([]fleet.Runner, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]fleet.Runner(nil), m.rs...), nil
}

func (m *mutable) set(eps ...client.Endpoint) {
	m.mu.Lock()
	m.rs = nil
	for _, ep := range eps {
		m.rs = append(m.rs, fleet.Runner{Endpoint: ep})
	}
	m.mu.Unlock()
}

// cordon marks the runner named name cordoned.
func (m *mutable) cordon(name string) {
	m.mu.Lock()
	for i := range m.rs {
		if m.rs[i].Name == name {
			m.rs[i].Cordoned = true
		}
	}
	m.mu.Unlock()
}

// three starts three runnerds with flags (one set each) and returns them
// with their endpoints r1, r2, r3.
func three(t *testing.T, flags ...[]string) ([]*daemon, []client.Endpoint) {
	t.Helper()
	var ds []*daemon
	var eps []client.Endpoint
	for i := range 3 {
		f := []string{"--netpolicy", "off"}
		if i < len(flags) {
			f = append(f, flags[i]...)
		}
		d := startDaemon(t, f...)
		t.Cleanup(d.stop)
		ds = append(ds, d)
		eps = append(eps, client.Endpoint{Name: "r" + strconv.Itoa(i+1), URL: d.url(), Token: d.token})
	}
	return ds, eps
}

func newPool(t *testing.T, d fleet.Discovery, refresh time.Duration) *fleet.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := fleet.New(ctx, d, fleet.Options{Adapter: client.AdapterOptions{Client: testOptions}, Refresh: refresh})
	if err != nil {
		t.Fatalf("fleet.New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func runnerOf(name string) string { r, _, _ := strings.Cut(name, "-"); return r }

// TestPlacementSpread: 300 placements over three equal runners land
// within ±20 % of 100 each, with placements made concurrently (the
// pool's in-flight count keeps a burst off one runner between reports).
func TestPlacementSpread(t *testing.T) {
	_, eps := three(t)
	p := newPool(t, fleet.Static(eps), 200*time.Millisecond)
	ctx := context.Background()
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	jobs := make(chan int)
	for range 8 {
		wg.Go(func() {
			for range jobs {
				h, err := p.Place(ctx, "spread", adapter.CreateOptions{})
				if err != nil {
					t.Errorf("Place: %v", err)
					continue
				}
				mu.Lock()
				count[runnerOf(h.Name)]++
				mu.Unlock()
			}
		})
	}
	for i := range 300 {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	for _, ep := range eps {
		if n := count[ep.Name]; n < 80 || n > 120 {
			t.Errorf("runner %s took %d of 300 (all: %v), want 80..120", ep.Name, n, count)
		}
	}
	// Each placement is on the runner its name names.
	for _, ep := range eps {
		c := newClient(t, &daemon{addr: strings.TrimPrefix(ep.URL, "http://"), token: ep.Token})
		l, err := c.ListSandboxes(ctx, 500, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Sandboxes) != count[ep.Name] {
			t.Errorf("runner %s holds %d sandboxes, pool placed %d there", ep.Name, len(l.Sandboxes), count[ep.Name])
		}
		for _, sb := range l.Sandboxes {
			if runnerOf(sb.Name) != ep.Name {
				t.Errorf("runner %s holds %s", ep.Name, sb.Name)
			}
		}
	}
}

// TestPlacementSkipsExhausted: a runner whose report is stale (it looked
// empty) but that answers exhausted is skipped, and the placement goes
// elsewhere; when every runner is full, Place answers fleet.ErrExhausted.
func TestPlacementSkipsExhausted(t *testing.T) {
	ds, eps := three(t, []string{"--max-sandboxes", "3"}, []string{"--max-sandboxes", "3"}, []string{"--max-sandboxes", "3"})
	p := newPool(t, fleet.Static(eps), -1) // reports only from New
	ctx := context.Background()
	// Fill r1 behind the pool's back: its report still says 3 free.
	c1 := newClient(t, ds[0])
	for i := range 3 {
		if _, err := c1.CreateSandbox(ctx, wire.CreateSandbox{Name: fmt.Sprintf("r1-direct-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	count := map[string]int{}
	for range 6 {
		h, err := p.Place(ctx, "skip", adapter.CreateOptions{})
		if err != nil {
			t.Fatalf("Place with room on r2 and r3: %v", err)
		}
		count[runnerOf(h.Name)]++
	}
	if count["r1"] != 0 || count["r2"] != 3 || count["r3"] != 3 {
		t.Errorf("placements = %v, want r2: 3, r3: 3, none on the exhausted r1", count)
	}
	// r1 is still reported free (stale), so this placement tries it and
	// must move past its exhausted answer to the conclusion.
	if h, err := p.Place(ctx, "skip", adapter.CreateOptions{}); !errors.Is(err, fleet.ErrExhausted) || !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("Place on a full fleet = %v, %v; want fleet.ErrExhausted (unavailable)", h, err)
	}
}

// TestRoutesAcrossDiscoveryChanges: names keep their route whatever
// discovery says; a runner discovery drops makes its sandboxes
// unavailable, never not_found, and takes no placement; after kill -9 of
// a runnerd its sandboxes are unavailable and its sessions replay
// byte-exactly once it restarts.
func TestRoutesAcrossDiscoveryChanges(t *testing.T) {
	ds, eps := three(t)
	disc := &mutable{}
	disc.set(eps...)
	p := newPool(t, disc, -1) // the test refreshes
	ctx := context.Background()
	on := map[string][]adapter.Handle{}
	for range 12 {
		h, err := p.Place(ctx, "route", adapter.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		on[runnerOf(h.Name)] = append(on[runnerOf(h.Name)], h)
	}
	for _, ep := range eps {
		if len(on[ep.Name]) == 0 {
			t.Fatalf("no placement on %s: %v", ep.Name, on)
		}
	}
	// A session on r3 whose output is known: seq 1 3000, then it stays.
	victim := on["r3"][0]
	st, err := p.Spawn(ctx, victim, adapter.Shell("seq 1 3000; sleep 300"), adapter.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.SessionID()
	var want bytes.Buffer
	for i := 1; i <= 3000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got := readStdout(t, st, want.Len()); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("live stdout: %d bytes, want %d", len(got), want.Len())
	}
	st.Close()

	// r2 leaves discovery (NotReady, cordoned, deleted).
	disc.set(eps[0], eps[2])
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	wantUnavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, adapter.ErrUnavailable) || errors.Is(err, adapter.ErrNotFound) {
			t.Errorf("%s = %v, want unavailable, never not_found", what, err)
		}
	}
	for _, h := range on["r2"] {
		_, err := p.Get(ctx, h.Name)
		wantUnavailable("Get of "+h.Name+" on a runner discovery dropped", err)
		_, err = p.Exec(ctx, h, adapter.Shell("true"))
		wantUnavailable("Exec on "+h.Name, err)
	}
	if _, err := adapter.ListAll(ctx, p, 0, 0); !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("ListAll without r2 = %v, want unavailable (never a short listing)", err)
	}
	for range 10 {
		h, err := p.Place(ctx, "route", adapter.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if runnerOf(h.Name) == "r2" {
			t.Errorf("placement %s on a runner discovery dropped", h.Name)
		}
	}
	// The names of r1 keep their route.
	for _, h := range on["r1"] {
		if _, err := p.Get(ctx, h.Name); err != nil {
			t.Errorf("Get of %s on a listed runner: %v", h.Name, err)
		}
	}
	// r2 comes back at a new address (a restarted pod): same name, same
	// sandboxes, same routes.
	px := startProxy(t, eps[1].URL)
	t.Cleanup(px.close)
	moved := eps[1]
	moved.URL = px.url()
	disc.set(eps[0], moved, eps[2])
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range on["r2"] {
		if _, err := p.Get(ctx, h.Name); err != nil {
			t.Errorf("Get of %s after r2 came back: %v", h.Name, err)
		}
	}

	// A cordoned runner takes no placement; its sandboxes keep serving.
	disc.cordon("r1")
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		h, err := p.Place(ctx, "route", adapter.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if runnerOf(h.Name) == "r1" {
			t.Errorf("placement %s on a cordoned runner", h.Name)
		}
	}
	for _, h := range on["r1"] {
		if r, err := p.Exec(ctx, h, adapter.Shell("echo still")); err != nil || string(r.Stdout) != "still\n" {
			t.Errorf("Exec on %s of a cordoned runner = %q, %v; want it served", h.Name, r.Stdout, err)
		}
	}

	// kill -9 of r3: unavailable (listed or not), never not_found.
	ds[2].kill9()
	_, err = p.Get(ctx, victim.Name)
	wantUnavailable("Get on a killed runnerd", err)
	_, err = p.Sessions(ctx, victim)
	wantUnavailable("Sessions on a killed runnerd", err)
	disc.set(eps[0], moved)
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = p.Get(ctx, victim.Name)
	wantUnavailable("Get on a killed runnerd discovery dropped", err)
	ds[2].restart(t)
	disc.set(eps[0], moved, eps[2])
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, victim.Name); err != nil {
		t.Fatalf("Get after r3 restarted: %v", err)
	}
	at, err := p.Attach(ctx, victim, id, adapter.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	defer at.Close()
	if got := readStdout(t, at, want.Len()); !bytes.Equal(got, want.Bytes()) {
		t.Errorf("replay after kill -9 and restart: %d bytes differ from the %d written", len(got), want.Len())
	}
	if _, err := p.TerminateSession(ctx, victim, id, time.Second); err != nil {
		t.Errorf("terminate: %v", err)
	}
}

// readStdout reads n bytes of stdout from st, checking offsets are
// contiguous.
func readStdout(t *testing.T, st adapter.Stream, n int) []byte {
	t.Helper()
	var out []byte
	timeout := time.After(20 * time.Second)
	for len(out) < n {
		select {
		case f, ok := <-st.Frames():
			if !ok {
				t.Fatalf("stream ended after %d of %d bytes", len(out), n)
			}
			if f.Terminal() {
				t.Fatalf("stream ended after %d of %d bytes: %v", len(out), n, f)
			}
			if f.Stream != adapter.Stdout {
				continue
			}
			if f.Offset != int64(len(out)) {
				t.Fatalf("stdout frame at %d, want %d", f.Offset, len(out))
			}
			out = append(out, f.Data...)
		case <-timeout:
			t.Fatalf("read %d of %d bytes in 20s", len(out), n)
		}
	}
	return out
}

// TestFleetConformance runs the whole contract suite against the fleet
// pool over three runners, names minted for each in turn, with the
// background refresh on.
func TestFleetConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("the fleet conformance run takes a minute")
	}
	ds, eps := three(t)
	px := startProxy(t, eps[0].URL) // a listing visits r1 first
	t.Cleanup(px.close)
	eps[0].URL = px.url()
	var mu sync.Mutex
	n := 0
	conformance.Run(t, conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, err := fleet.New(ctx, fleet.Static(eps), fleet.Options{Adapter: client.AdapterOptions{Client: testOptions}, Refresh: time.Second})
			if err != nil {
				t.Fatalf("fleet.New: %v", err)
			}
			t.Cleanup(func() { p.Close() })
			return conformance.Subject{
				Adapter: p,
				Outage: func() func() {
					for _, d := range ds {
						d.signal(syscall.SIGSTOP)
					}
					return func() {
						for _, d := range ds {
							d.signal(syscall.SIGCONT)
						}
					}
				},
				InterruptList: px.interruptList,
			}
		},
		NewName: func(t conformance.T) string {
			mu.Lock()
			n++
			r := eps[n%3].Name
			mu.Unlock()
			return client.NewName(r, "conf")
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  60 * time.Second,
	})
}
