package journal

// The writer's end: Finish (the exit record published last, after every
// byte is synced) and Close (no exit record), both releasing index.db.

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/agentrunner/runner/internal/atomicfile"
)

// Finish ends the journal: it fills e.Lengths with the final length of every
// stream (and e.Time if zero), fsyncs everything, commits the exit record to
// the index, publishes exit.json (tmp file, fsync, rename, directory fsync),
// and closes the writer. Writes after Finish return ErrFinished. The writer
// is closed even when Finish fails; the journal then has no exit record and
// a later Recover may retry.
func (w *Writer) Finish(e Exit) error {
	switch e.Reason {
	case ReasonExited, ReasonSignaled, ReasonLost:
	default:
		return fmt.Errorf("finish journal: invalid exit reason %q", e.Reason)
	}
	w.stopSyncer()
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.state != nil {
		return w.state
	}
	w.state = ErrFinished
	e.Lengths = map[string]int64{}
	for _, s := range w.order {
		s.mu.Lock()
		s.err = ErrFinished
		e.Lengths[s.name] = s.length
		s.mu.Unlock()
	}
	if e.Time.IsZero() {
		e.Time = time.Now().UTC()
	}
	// The reserve gives what the final commit and exit.json take (blocks
	// and an inode) before they are written, so a full disk cannot keep a
	// session from ending.
	releaseReserve(w.dir)
	b, err := json.Marshal(e)
	if err == nil {
		err = w.flushLocked(b)
	}
	published := false
	if err == nil {
		err = publishExit(w.dir, b)
		published = err == nil
	}
	// index.db released before the directory's fsync: a follower ends as
	// soon as it sees exit.json and the writer gone, and the fsync (which
	// only a power loss could tell from its absence, and which Recover
	// repairs from the index then) is not on its path.
	if cerr := w.closeFilesLocked(); err == nil {
		err = cerr
	}
	if published {
		if serr := atomicfile.SyncDir(w.dir); err == nil {
			err = serr
		}
	}
	if err != nil {
		return fmt.Errorf("finish journal %s: %w", w.dir, err)
	}
	return nil
}

// Close closes the writer without an exit record, after a final sync. A
// later Recover continues the journal; until then followers end with
// ErrLost. Close is idempotent and returns nil after Finish.
func (w *Writer) Close() error {
	w.stopSyncer()
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.state != nil {
		return nil
	}
	w.state = ErrClosed
	for _, s := range w.order {
		s.mu.Lock()
		s.err = ErrClosed
		s.mu.Unlock()
	}
	err := w.flushLocked(nil)
	if cerr := w.closeFilesLocked(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close journal %s: %w", w.dir, err)
	}
	return nil
}

// closeFilesLocked closes every segment and then index.db, which releases
// the liveness lock. Every stream's err is already set, so no write races.
func (w *Writer) closeFilesLocked() error {
	var firstErr error
	for _, s := range w.order {
		s.mu.Lock()
		for _, f := range s.sealed {
			f.Close()
		}
		s.sealed = nil
		if err := s.f.Close(); err != nil && firstErr == nil {
			firstErr = err
		}
		s.mu.Unlock()
	}
	if err := w.db.Close(); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}
