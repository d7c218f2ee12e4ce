package registry_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/agentrunner/runner/daemon/registry"
)

// listAll pages through sandbox's sessions limit at a time and returns
// their ids in listing order.
func listAll(t *testing.T, r *registry.Registry, sandbox string, limit int) []string {
	t.Helper()
	var ids []string
	var after *registry.SessionCursor
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("listing does not end")
		}
		_, page, more, err := r.ListSessionsPage(sandbox, after, limit)
		if err != nil {
			t.Fatalf("list sessions: %v", err)
		}
		if len(page) > limit {
			t.Fatalf("page of %d, limit %d", len(page), limit)
		}
		for _, s := range page {
			ids = append(ids, s.ID)
		}
		if !more {
			return ids
		}
		if len(page) == 0 {
			t.Fatal("empty page with more to come")
		}
		last := page[len(page)-1]
		after = &registry.SessionCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
}

// TestListSessionsPageStartOrder: sessions list in start order (not id
// order), page by page, each exactly once; a StartedAt that moves later
// (the shim's own start time) does not move a session's place; another
// sandbox's sessions never show; deletes leave no index entry behind.
func TestListSessionsPageStartOrder(t *testing.T) {
	r, err := registry.Open(filepath.Join(t.TempDir(), "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, name := range []string{"box", "box2", "bo"} {
		if _, _, err := r.CreateSandbox(registry.Sandbox{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var want []string
	for i := range 25 {
		// ids descend while start times ascend: an id-ordered listing
		// would come out reversed.
		id := fmt.Sprintf("s%03d", 100-i)
		want = append(want, id)
		for _, sb := range []string{"box", "box2", "bo"} {
			if _, err := r.CreateSession(registry.Session{Sandbox: sb, ID: id, StartedAt: base.Add(time.Duration(i) * time.Millisecond)}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The first session's start moves past every other one.
	if _, err := r.UpdateSession("box", want[0], func(s *registry.Session) error {
		s.StartedAt = base.Add(time.Hour)
		s.CreatedAt = base.Add(time.Hour) // ignored: the order key never moves
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{1, 3, 7, 25, 100} {
		got := listAll(t, r, "box", limit)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("limit %d: got %v, want %v", limit, got, want)
		}
	}
	if err := r.DeleteSession("box", want[3]); err != nil {
		t.Fatal(err)
	}
	if err := r.DeleteSessionIf("box", want[4], func(registry.Session) error { return nil }); err != nil {
		t.Fatal(err)
	}
	rest := append(append([]string{}, want[:3]...), want[5:]...)
	if got := listAll(t, r, "box", 4); fmt.Sprint(got) != fmt.Sprint(rest) {
		t.Errorf("after deletes: got %v, want %v", got, rest)
	}
	if err := r.DeleteSandbox("box"); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := r.ListSessionsPage("box", nil, 10); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("list of a deleted sandbox: got %v, want ErrNotFound", err)
	}
	if got := listAll(t, r, "box2", 10); len(got) != 25 {
		t.Errorf("box2 after box's delete: got %d sessions, want 25", len(got))
	}
}

// TestOpenIndexesOldRegistry: a registry written by a runnerd without the
// start index (records without created_at, no index bucket) opens, lists
// every session in start order, and keeps the order after a reopen.
func TestOpenIndexesOldRegistry(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var want []string
	err = db.Update(func(tx *bolt.Tx) error {
		sbs, err := tx.CreateBucket([]byte("sandboxes"))
		if err != nil {
			return err
		}
		raw, _ := json.Marshal(map[string]any{"name": "box", "incarnation": "abc", "state": "active"})
		if err := sbs.Put([]byte("box"), raw); err != nil {
			return err
		}
		ss, err := tx.CreateBucket([]byte("sessions"))
		if err != nil {
			return err
		}
		for i := range 40 {
			id := fmt.Sprintf("z%02d", 40-i)
			want = append(want, id)
			// The previous version's record, field for field.
			raw, _ := json.Marshal(map[string]any{"sandbox": "box", "id": id, "incarnation": "abc", "key": id,
				"request": map[string]any{"argv": []string{"true"}}, "state": "running",
				"started_at": base.Add(time.Duration(i) * time.Second)})
			if err := ss.Put([]byte("box\x00"+id), raw); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	for range 2 {
		r, err := registry.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := listAll(t, r, "box", 6); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("old registry: got %v, want %v", got, want)
		}
		s, err := r.GetSession("box", want[0])
		if err != nil || !s.CreatedAt.Equal(base) {
			t.Errorf("migrated record: created_at %v err %v, want %v", s.CreatedAt, err, base)
		}
		r.Close()
	}
}
