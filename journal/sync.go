package journal

// The writer's sync points: the background syncer that fsyncs every
// SyncInterval, Sync, and flushLocked, which fsyncs the written segments
// and commits lengths, segments and marks to index.db (pruning old marks).

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentrunner/runner/internal/atomicfile"
	bolt "go.etcd.io/bbolt"
)

// syncer flushes every SyncInterval until stop is closed.
func (w *Writer) syncer() {
	defer close(w.done)
	t := time.NewTicker(w.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.syncMu.Lock()
			if w.state == nil {
				// An error here resurfaces on the next Sync or Finish, which
				// repeat the same fsyncs; the index is repaired by Recover.
				_ = w.flushLocked(nil)
			}
			w.syncMu.Unlock()
		}
	}
}

func (w *Writer) stopSyncer() {
	w.stopOnce.Do(func() {
		close(w.stop)
		<-w.done
	})
}

// Sync fsyncs every segment written since the last sync and commits the
// lengths, segments and marks to the index. The writer also does this by
// itself every SyncInterval.
func (w *Writer) Sync() error {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.state != nil {
		return w.state
	}
	return w.flushLocked(nil)
}

// flushLocked fsyncs segments and stream directories, then commits one
// index transaction with the synced lengths (and exit, if non-nil).
// syncMu is held. fsyncs run without the stream locks, so writes proceed.
func (w *Writer) flushLocked(exit []byte) error {
	type snap struct {
		s                *wstream
		length, start    int64
		f                *os.File
		dirty            bool
		sealed           []*os.File
		created, removed []int64
		marks            []mark
	}
	snaps := make([]snap, len(w.order))
	changed := exit != nil
	for i, s := range w.order {
		s.mu.Lock()
		snaps[i] = snap{s, s.length, s.segs[0], s.f, s.dirty, s.sealed, s.created, s.removed, s.marks}
		s.dirty, s.sealed, s.created, s.removed, s.marks = false, nil, nil, nil, nil
		s.mu.Unlock()
		sn := &snaps[i]
		changed = changed || sn.dirty || len(sn.sealed) > 0 || len(sn.created) > 0 || len(sn.removed) > 0 || len(sn.marks) > 0
	}
	if !changed && !w.createSync {
		return nil
	}
	var firstErr error
	keep := func(err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if w.createSync {
		// What a deferred Create skipped: the new entries and journal.json.
		// index.db is fdatasynced by the commit below; its entry by the
		// journal directory's sync.
		for _, s := range w.order {
			keep(atomicfile.SyncDir(s.dir))
		}
		keep(syncFile(filepath.Join(w.dir, metaName)))
		keep(atomicfile.SyncDir(w.dir))
	}
	for _, sn := range snaps {
		for _, f := range sn.sealed {
			keep(f.Sync())
			keep(f.Close())
		}
		if sn.dirty {
			// The file may have been sealed since the snapshot (still open,
			// now in s.sealed); Sync is safe either way.
			keep(sn.f.Sync())
		}
		if len(sn.created) > 0 || len(sn.removed) > 0 {
			keep(atomicfile.SyncDir(sn.s.dir))
		}
	}
	if firstErr != nil {
		return fmt.Errorf("sync journal: %w", firstErr)
	}
	err := w.db.Update(func(tx *bolt.Tx) error {
		sb := tx.Bucket(bktStreams)
		for _, sn := range snaps {
			b := sb.Bucket([]byte(sn.s.name))
			b.Put(keyLength, u64(sn.length))
			b.Put(keyStart, u64(sn.start))
			segs := b.Bucket(bktSegs)
			for _, off := range sn.created {
				segs.Put(u64(off), nil)
			}
			for _, off := range sn.removed {
				segs.Delete(u64(off))
			}
			marks := b.Bucket(bktMarks)
			for _, m := range sn.marks {
				marks.Put(u64(m.nanos), u64(m.off))
			}
			if len(sn.removed) > 0 {
				pruneMarks(marks, sn.start)
			}
		}
		if exit != nil {
			tx.Bucket(bktMeta).Put(keyExit, exit)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("commit journal index: %w", err)
	}
	w.createSync = false
	return nil
}

// pruneMarks deletes marks for bytes no longer retained, keeping the last
// one before start (it still bounds the time of the first retained byte).
func pruneMarks(marks *bolt.Bucket, start int64) {
	c := marks.Cursor()
	var doomed [][]byte
	k, _ := c.First()
	for k != nil {
		nk, nv := c.Next()
		if nk == nil || getU64(nv) > start {
			break
		}
		doomed = append(doomed, k)
		k = nk
	}
	for _, k := range doomed {
		marks.Delete(k)
	}
}
