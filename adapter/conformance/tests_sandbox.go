package conformance

// Sandbox lifecycle checks: Create is idempotent per name and gives a new
// incarnation after Destroy, Get reports not-found only for a sandbox that
// is gone (never for an outage), Destroy of an absent sandbox succeeds, and
// List pages completely and reports an interrupted listing as an error.

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/agentrunner/runner/adapter"
)

func testCreateIdempotent(t T, h Harness) {
	e := setup(t, h)
	name := e.name()
	const n = 8
	hs := make([]adapter.Handle, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { hs[i], errs[i] = e.a.Create(e.ctx, name, adapter.CreateOptions{}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("concurrent Create(%q) #%d = %v", name, i, errs[i])
		}
	}
	t.Cleanup(func() { e.destroyQuietly(hs[0]) })
	for i := range n {
		if !hs[i].Same(hs[0]) {
			t.Errorf("concurrent Create(%q) gave handles %v and %v, want one sandbox", name, hs[0], hs[i])
		}
	}
	h0 := hs[0]
	if h0.Provider != e.a.Provider() || h0.Name != name || h0.ID == "" {
		t.Errorf("Create(%q) = %v, want provider %q, that name and an incarnation id", name, h0, e.a.Provider())
	}
	again, err := e.a.Create(e.ctx, name, adapter.CreateOptions{})
	if err != nil || !again.Same(h0) {
		t.Errorf("second Create(%q) = %v, %v; want %v", name, again, err, h0)
	}
	got, err := e.a.Get(e.ctx, name)
	if err != nil || !got.Same(h0) {
		t.Errorf("Get(%q) = %v, %v; want %v", name, got, err, h0)
	}
	hsAll, err := adapter.ListAll(e.ctx, e.a, 0, 0)
	if err != nil {
		t.Fatalf("ListAll = %v", err)
	}
	count := 0
	for _, x := range hsAll {
		if x.Name == name {
			count++
		}
	}
	if count != 1 {
		t.Errorf("listing shows %d sandboxes named %q, want 1", count, name)
	}
}

func testCreateNewIncarnation(t T, h Harness) {
	e := setup(t, h)
	name := e.name()
	old := e.createNamed(name, adapter.CreateOptions{})
	if err := e.a.Destroy(e.ctx, old); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	cur := e.createNamed(name, adapter.CreateOptions{})
	if cur.ID == old.ID {
		t.Errorf("re-create after destroy kept incarnation id %q, want a new one", cur.ID)
	}
	if _, err := e.a.Sessions(e.ctx, old); !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("Sessions(stale handle) = %v, want not_found (that incarnation is gone)", err)
	}
	if err := e.a.Destroy(e.ctx, old); err != nil {
		t.Errorf("Destroy(stale handle) = %v, want nil", err)
	}
	if got, err := e.a.Get(e.ctx, name); err != nil || !got.Same(cur) {
		t.Errorf("after Destroy(stale handle), Get = %v, %v; want the new incarnation %v untouched", got, err, cur)
	}
}

func testGetNotFound(t T, h Harness) {
	e := setup(t, h)
	never := e.name()
	_, err := e.a.Get(e.ctx, never)
	e.wantKind(fmt.Sprintf("Get(never created %q)", never), err, adapter.ErrNotFound)
	hd := e.create()
	if err := e.a.Destroy(e.ctx, hd); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	_, err = e.a.Get(e.ctx, hd.Name)
	e.wantKind("Get(destroyed)", err, adapter.ErrNotFound)
	if adapter.Transient(err) {
		t.Errorf("Get(destroyed) error %v is transient, want definitive", err)
	}
}

func testOutage(t T, h Harness) {
	e := setup(t, h)
	if e.s.Outage == nil {
		skipHook(t, "Outage")
	}
	hd := e.create()
	stay := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	if !stay.stdoutHas("ready") {
		t.Fatalf("SpawnStay printed %s, want ready", quoteAll(stay.out[0]))
	}
	id := stay.st.SessionID()
	restore := e.s.Outage()
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()
	check := func(call string, err error) {
		t.Helper()
		if errors.Is(err, adapter.ErrNotFound) || errors.Is(err, adapter.ErrLost) {
			t.Errorf("during an outage %s = %v: a live sandbox must never read as gone", call, err)
		}
	}
	_, err := e.a.Get(e.ctx, hd.Name)
	check("Get", err)
	if err != nil && !adapter.Transient(err) {
		t.Errorf("during an outage Get = %v (kind %s), want a transient error", err, adapter.KindOf(err))
	}
	_, err = e.a.Create(e.ctx, hd.Name, adapter.CreateOptions{})
	check("Create(existing)", err)
	_, err = e.a.Sessions(e.ctx, hd)
	check("Sessions", err)
	_, err = e.a.Exec(e.ctx, hd, e.fx.ExecOK)
	check("Exec", err)
	check("WriteStdin", e.a.WriteStdin(e.ctx, hd, id, []byte("x\n")))
	if st, err := e.a.Attach(e.ctx, hd, id, adapter.Cursor{}); err == nil {
		_ = st.Close()
	} else if !errors.Is(err, adapter.ErrNotSupported) {
		check("Attach", err)
	}
	p, err := e.a.List(e.ctx, adapter.ListOptions{})
	check("List", err)
	if err == nil && p.NextPageToken == "" && !slices.ContainsFunc(p.Handles, hd.Same) {
		t.Errorf("during an outage List returned a complete listing without %v, want an error", hd)
	}
	restore()
	restored = true
	if got, err := e.a.Get(e.ctx, hd.Name); err != nil || !got.Same(hd) {
		t.Errorf("after the outage Get = %v, %v; want %v", got, err, hd)
	}
	if err := e.a.CloseStdin(e.ctx, hd, id); err != nil {
		t.Errorf("after the outage CloseStdin = %v", err)
	}
	stay.wantExit("exit 0", success)
}

func testDestroyAbsent(t T, h Harness) {
	e := setup(t, h)
	never := adapter.Handle{Provider: e.a.Provider(), Name: e.name(), ID: "never-created"}
	if err := e.a.Destroy(e.ctx, never); err != nil {
		t.Errorf("Destroy(never created) = %v, want nil", err)
	}
	hd := e.create()
	for i := range 2 {
		if err := e.a.Destroy(e.ctx, hd); err != nil {
			t.Errorf("Destroy #%d = %v, want nil", i+1, err)
		}
	}
}

// createMany makes n sandboxes and returns them by name.
func (e *env) createMany(n int) map[string]adapter.Handle {
	e.t.Helper()
	want := map[string]adapter.Handle{}
	for range n {
		hd := e.create()
		want[hd.Name] = hd
	}
	return want
}

func testListPaged(t T, h Harness) {
	e := setup(t, h)
	want := e.createMany(5)
	const size = 2
	seen := map[string]int{}
	token, pages := "", 0
	for {
		pages++
		if pages > 1000 {
			t.Fatalf("listing did not end after 1000 pages of %d", size)
		}
		p, err := e.a.List(e.ctx, adapter.ListOptions{PageToken: token, PageSize: size})
		if err != nil {
			t.Fatalf("List page %d = %v", pages, err)
		}
		if len(p.Handles) > size {
			t.Errorf("List page %d has %d handles, want at most PageSize %d", pages, len(p.Handles), size)
		}
		for _, x := range p.Handles {
			if w, ok := want[x.Name]; ok && !x.Same(w) {
				t.Errorf("List shows %v, want %v", x, w)
			}
			seen[x.Name]++
		}
		if p.NextPageToken == "" {
			break
		}
		if p.NextPageToken == token {
			t.Fatalf("List page %d returned its own token %q again: the listing cannot end", pages, token)
		}
		token = p.NextPageToken
	}
	if pages < 3 {
		t.Errorf("listing of at least 5 sandboxes took %d pages of %d, want at least 3", pages, size)
	}
	for name := range want {
		if seen[name] != 1 {
			t.Errorf("paged listing shows %q %d times, want once", name, seen[name])
		}
	}
	_, err := e.a.List(e.ctx, adapter.ListOptions{PageToken: "not-a-token-this-adapter-issued"})
	if err == nil {
		t.Errorf("List(forged page token) = nil error, want invalid")
	} else if errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("List(forged page token) = %v, want invalid, never not_found", err)
	}
}

func testListInterrupted(t T, h Harness) {
	e := setup(t, h)
	if e.s.InterruptList == nil {
		skipHook(t, "InterruptList")
	}
	want := e.createMany(3)
	e.s.InterruptList()
	hs, err := adapter.ListAll(e.ctx, e.a, 2, 1000)
	if err == nil {
		missing := 0
		for name := range want {
			if !slices.ContainsFunc(hs, func(x adapter.Handle) bool { return x.Name == name }) {
				missing++
			}
		}
		t.Errorf("an interrupted listing succeeded with %d handles (%d of ours missing), want an error: a short set that looks whole makes a reaper act", len(hs), missing)
	} else if errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("interrupted listing = %v, want a transient error, never not_found", err)
	}
	hs, err = adapter.ListAll(e.ctx, e.a, 2, 1000)
	if err != nil {
		t.Fatalf("listing after the interruption = %v", err)
	}
	for name := range want {
		if !slices.ContainsFunc(hs, func(x adapter.Handle) bool { return x.Name == name }) {
			t.Errorf("listing after the interruption misses %q", name)
		}
	}
}
