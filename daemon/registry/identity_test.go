package registry_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/agentrunner/runner/daemon/registry"
)

func openReg(t *testing.T, path string) *registry.Registry {
	t.Helper()
	r, err := registry.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// TestIdentityConcurrentUnique: concurrent creates of distinct sandboxes
// never share a uid, a second create of one name returns the first's
// identity, and a full pool answers ErrNoIdentity with nothing stored.
func TestIdentityConcurrentUnique(t *testing.T) {
	r := openReg(t, filepath.Join(t.TempDir(), "registry.db"))
	pool := &registry.IdentityPool{First: 70000, Last: 70031}
	var wg sync.WaitGroup
	got := make([]registry.Sandbox, 64) // 32 names, each created twice
	errs := make([]error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], _, errs[i] = r.CreateSandboxIdentity(registry.Sandbox{Name: fmt.Sprintf("sb%d", i%32)}, pool)
		}()
	}
	wg.Wait()
	owner := map[uint32]string{}
	for i, sb := range got {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if sb.Identity == nil || sb.Identity.UID < 70000 || sb.Identity.UID > 70031 || sb.Identity.GID != sb.Identity.UID {
			t.Fatalf("create %s: identity %+v, want uid=gid in 70000-70031", sb.Name, sb.Identity)
		}
		if o, ok := owner[sb.Identity.UID]; ok && o != sb.Name {
			t.Fatalf("uid %d given to %s and %s", sb.Identity.UID, o, sb.Name)
		}
		owner[sb.Identity.UID] = sb.Name
	}
	if len(owner) != 32 {
		t.Fatalf("%d distinct uids for 32 sandboxes", len(owner))
	}
	held, err := r.Identities()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(held) != fmt.Sprint(owner) {
		t.Fatalf("registry holds %v, want %v", held, owner)
	}
	_, _, err = r.CreateSandboxIdentity(registry.Sandbox{Name: "full"}, pool)
	if !errors.Is(err, registry.ErrNoIdentity) {
		t.Fatalf("create in a full pool: got %v, want ErrNoIdentity", err)
	}
	if _, err := r.GetSandbox("full"); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("a refused create stored a record: %v", err)
	}
}

// TestIdentityLifecycle: the identity is durable with the record (a
// reopen sees it), skips uids the host uses, is freed by DeleteSandbox
// and is handed out again once the cursor comes round.
func TestIdentityLifecycle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.db")
	r := openReg(t, path)
	pool := &registry.IdentityPool{First: 100, Last: 102, Taken: func(id uint32) bool { return id == 101 }}
	a, _, err := r.CreateSandboxIdentity(registry.Sandbox{Name: "a"}, pool)
	if err != nil || a.Identity == nil || a.Identity.UID != 100 {
		t.Fatalf("a: %+v, %v; want uid 100", a.Identity, err)
	}
	b, _, err := r.CreateSandboxIdentity(registry.Sandbox{Name: "b"}, pool)
	if err != nil || b.Identity == nil || b.Identity.UID != 102 {
		t.Fatalf("b: %+v, %v; want uid 102 (101 is taken by the host)", b.Identity, err)
	}
	// Without a pool, no identity.
	c, _, err := r.CreateSandboxIdentity(registry.Sandbox{Name: "c"}, nil)
	if err != nil || c.Identity != nil {
		t.Fatalf("c: %+v, %v; want no identity", c.Identity, err)
	}
	r.Close()
	r = openReg(t, path)
	if got, err := r.GetSandbox("a"); err != nil || got.Identity == nil || *got.Identity != *a.Identity {
		t.Fatalf("after reopen a: %+v, %v; want %+v", got.Identity, err, a.Identity)
	}
	if _, _, err := r.CreateSandboxIdentity(registry.Sandbox{Name: "d"}, pool); !errors.Is(err, registry.ErrNoIdentity) {
		t.Fatalf("d with 100 and 102 held and 101 taken: %v, want ErrNoIdentity", err)
	}
	if err := r.DeleteSandbox("a"); err != nil {
		t.Fatal(err)
	}
	held, err := r.Identities()
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || held[102] != "b" {
		t.Fatalf("held after deleting a: %v, want only 102 by b", held)
	}
	d, _, err := r.CreateSandboxIdentity(registry.Sandbox{Name: "d"}, pool)
	if err != nil || d.Identity == nil || d.Identity.UID != 100 {
		t.Fatalf("d after a was deleted: %+v, %v; want a's uid 100", d.Identity, err)
	}
}
