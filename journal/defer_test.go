package journal

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// A journal created with DeferCreateSync works like any other, and its
// first sync point makes it durable (the flag is cleared).
func TestDeferCreateSync(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "j")
	w := mustCreate(t, dir, Options{Streams: []string{"stdout", "stderr"}, DeferCreateSync: true})
	if !w.createSync {
		t.Fatal("deferred Create: the first sync point is not pending")
	}
	w.Write("stdout", patternBytes(0, 0, 100))
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if w.createSync {
		t.Fatal("after Sync: the deferred create sync is still pending")
	}
	if err := w.Finish(Exit{Reason: ReasonExited, Code: 3}); err != nil {
		t.Fatal(err)
	}
	j := mustOpen(t, dir)
	if got := readRange(t, j, "stdout", 0); !bytes.Equal(got, patternBytes(0, 0, 100)) {
		t.Fatalf("got %d bytes of wrong content", len(got))
	}
	if e, ok, err := j.Exit(); err != nil || !ok || e.Code != 3 {
		t.Fatalf("exit: got %+v %v %v", e, ok, err)
	}
}

// What a power loss before the first sync point can leave of a deferred
// journal: Recover turns each into a clean empty journal, a missing index
// into fs.ErrNotExist (creating nothing), and a torn one into ErrCorrupt;
// it never panics.
func TestRecoverNeverSyncedJournal(t *testing.T) {
	streams := []string{"stdout", "stderr"}
	cases := []struct {
		name string
		// damage rewrites the closed journal in dir as a power loss could.
		damage  func(t *testing.T, dir string)
		wantErr error // nil: a clean empty journal
	}{
		{"empty index", func(t *testing.T, dir string) {
			must(t, os.Truncate(filepath.Join(dir, indexName), 0))
		}, nil},
		{"index without the create commit", func(t *testing.T, dir string) {
			p := filepath.Join(dir, indexName)
			must(t, os.Remove(p))
			db, err := bolt.Open(p, 0o600, nil) // bbolt's initial pages only
			must(t, err)
			must(t, db.Close())
		}, nil},
		{"no journal.json either", func(t *testing.T, dir string) {
			must(t, os.Truncate(filepath.Join(dir, indexName), 0))
			must(t, os.Remove(filepath.Join(dir, metaName)))
		}, nil},
		{"zero-filled segment tail", func(t *testing.T, dir string) {
			must(t, os.Truncate(filepath.Join(dir, indexName), 0))
			must(t, os.WriteFile(segPath(dir, "stdout", 0), make([]byte, 64), 0o600))
		}, nil},
		{"no index", func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, indexName)))
		}, fs.ErrNotExist},
		{"torn index", func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, indexName), bytes.Repeat([]byte{0xa5}, 8192), 0o600))
		}, ErrCorrupt},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "j")
			w := mustCreate(t, dir, Options{Streams: streams, DeferCreateSync: true})
			w.Write("stdout", []byte("not yet durable"))
			must(t, w.Close())
			tc.damage(t, dir)

			w2, err := Recover(dir)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Recover: got %v, want %v", err, tc.wantErr)
				}
				if errors.Is(err, fs.ErrNotExist) {
					if _, serr := os.Stat(filepath.Join(dir, indexName)); !errors.Is(serr, fs.ErrNotExist) {
						t.Errorf("Recover created index.db: %v", serr)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Recover: got %v, want a clean empty journal", err)
			}
			for _, s := range streams {
				if n := w2.Len(s); n != 0 {
					t.Errorf("stream %s: got length %d, want 0", s, n)
				}
			}
			must(t, w2.Finish(Exit{Reason: ReasonLost, Detail: "power loss"}))
			j := mustOpen(t, dir)
			if got := readRange(t, j, "stdout", 0); len(got) != 0 {
				t.Errorf("stdout: got %q, want nothing", got)
			}
			if e, ok, err := j.Exit(); err != nil || !ok || e.Reason != ReasonLost {
				t.Fatalf("exit: got %+v %v %v, want lost", e, ok, err)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
