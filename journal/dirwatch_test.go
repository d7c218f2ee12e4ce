package journal

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// awaitWake fails unless d wakes within 5 s.
func awaitWake(t *testing.T, d *DirWatch, what string) {
	t.Helper()
	select {
	case <-d.C():
	case <-time.After(5 * time.Second):
		t.Fatalf("no wake-up after %s", what)
	}
}

// A DirWatch wakes its owner when the journal's exit record is published
// and when its writer closes index.db, shares the Watcher's one inotify
// instance, and is no follower: Stats counts it apart from Readers.
func TestDirWatch(t *testing.T) {
	w := NewWatcher(WatcherOptions{})
	defer w.Close()
	dir := filepath.Join(t.TempDir(), "j")
	wr := mustCreate(t, dir, Options{Streams: []string{"stdout"}})

	d, err := w.WatchDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.Readers != 0 || st.DirWatches != 1 || st.Watches != 1 {
		t.Fatalf("stats with one DirWatch: got %+v, want 0 readers, 1 dir watch, 1 watch", st)
	}
	if d.Lost() {
		t.Fatal("DirWatch lost at once, want watched")
	}
	if err := wr.Finish(Exit{Reason: "exited"}); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, d, "Finish")
	if _, err := os.Stat(filepath.Join(dir, "exit.json")); err != nil {
		t.Fatalf("exit.json after Finish: %v", err)
	}
	d.Close()
	d.Close() // idempotent
	if st := w.Stats(); st.DirWatches != 0 || st.Watches != 0 {
		t.Fatalf("stats after Close: got %+v, want no dir watch and no watch", st)
	}

	// A writer that goes without an exit record closes index.db.
	dir2 := filepath.Join(t.TempDir(), "j")
	wr2 := mustCreate(t, dir2, Options{Streams: []string{"stdout"}})
	d2, err := w.WatchDir(dir2)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if err := wr2.Close(); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, d2, "the writer's Close")

	// A missing directory is the caller's error; a closed Watcher is ErrClosed.
	if _, err := w.WatchDir(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("WatchDir of a missing directory: got nil error, want one")
	}
	w.Close()
	if !d2.Lost() {
		t.Error("DirWatch after the Watcher closed: not lost, want lost (poll)")
	}
	if _, err := w.WatchDir(dir2); err != ErrClosed {
		t.Errorf("WatchDir on a closed Watcher: got %v, want ErrClosed", err)
	}
}
