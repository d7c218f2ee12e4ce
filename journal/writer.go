package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentrunner/runner/internal/atomicfile"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Writer appends to a journal. There is exactly one Writer per journal at a
// time (across processes): it holds index.db, whose exclusive flock is the
// liveness lock readers probe.
//
// Write, StreamWriter, Len and OffsetAt are safe for concurrent use; writes
// to different streams proceed in parallel, writes to one stream are
// serialized. Sync, Finish and Close are safe to call concurrently with
// writes. The owner must call Finish or Close; both stop the background
// syncer goroutine and release index.db.
type Writer struct {
	dir     string
	opts    Options
	db      *bolt.DB
	streams map[string]*wstream
	order   []*wstream // streams in Options order

	stopOnce sync.Once
	stop     chan struct{} // closed to stop the syncer
	done     chan struct{} // closed when the syncer has returned

	// syncMu serializes flushes (fsync + index commit), Finish and Close,
	// and guards state.
	syncMu sync.Mutex
	state  error // nil while open; ErrFinished or ErrClosed after
	// createSync is set by a Create with DeferCreateSync until the first
	// flush has made the journal's directories and files durable.
	createSync bool
	index      os.FileInfo // index.db when the writer started (Relocate)
}

type mark struct {
	nanos int64 // wall clock, strictly increasing per stream
	off   int64 // offset of the first byte of the write at that time
}

// wstream is the writer's side of one stream.
type wstream struct {
	name string
	dir  string

	// mu guards every field below.
	mu       sync.Mutex
	err      error    // non-nil after Finish/Close: returned by Write
	f        *os.File // active segment, opened O_APPEND
	base     int64    // first offset of f
	length   int64    // bytes written so far (the stream's end)
	segs     []int64  // first offsets of the retained segments; the last is f
	sealed   []*os.File
	created  []int64 // segments created since the last index commit
	removed  []int64 // segments removed by retention since the last commit
	marks    []mark  // marks not yet committed
	lastMark time.Time
	lastNano int64
	dirty    bool // bytes written since the last flush
}

// Create makes a new journal in dir (created with mode 0700 if needed) and
// returns its Writer. It returns ErrExists if dir already holds a journal.
func Create(dir string, opts Options) (*Writer, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create journal %s: %w", dir, err)
	}
	for _, name := range []string{indexName, exitName} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			return nil, fmt.Errorf("create journal %s: %w", dir, ErrExists)
		}
	}
	// The journal becomes visible only when index.db is renamed into place
	// already locked, so a reader never sees an unlocked index of a live
	// journal (which it would take for a lost writer). Leftovers of a Create
	// that crashed before that point belong to nobody and are overwritten.
	w := &Writer{dir: dir, opts: opts, streams: map[string]*wstream{}}
	fail := func(err error) (*Writer, error) {
		for _, s := range w.order {
			if s.f != nil {
				s.f.Close()
			}
		}
		if w.db != nil {
			w.db.Close()
		}
		return nil, fmt.Errorf("create journal %s: %w", dir, err)
	}
	for _, name := range opts.Streams {
		sdir := filepath.Join(dir, name)
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			return fail(err)
		}
		old, err := listSegments(sdir)
		if err != nil {
			return fail(err)
		}
		for _, off := range old {
			if err := os.Remove(segPath(dir, name, off)); err != nil {
				return fail(err)
			}
		}
		f, err := os.OpenFile(segPath(dir, name, 0), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
		if err != nil {
			return fail(err)
		}
		s := &wstream{name: name, dir: sdir, f: f, segs: []int64{0}}
		w.streams[name] = s
		w.order = append(w.order, s)
		if !opts.DeferCreateSync {
			if err := atomicfile.SyncDir(sdir); err != nil {
				return fail(err)
			}
		}
	}
	if err := writeMeta(dir, opts); err != nil {
		return fail(err)
	}
	if err := allocReserve(dir); err != nil {
		return fail(err)
	}
	tmp := filepath.Join(dir, indexTmpName)
	os.Remove(tmp)
	w.db, err = bolt.Open(tmp, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return fail(err)
	}
	// Deferred: this commit is made durable by the first flush's, which
	// fdatasyncs the whole file (bbolt's own initialisation still syncs).
	w.db.NoSync = opts.DeferCreateSync
	err = w.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bktMeta)
		if err != nil {
			return err
		}
		ob, _ := json.Marshal(storedOptions{opts.Streams, opts.SegmentBytes, opts.RetainBytes, opts.SyncInterval, opts.MarkInterval})
		meta.Put(keyVersion, u64(formatVersion))
		meta.Put(keyOptions, ob)
		meta.Put(keyBootID, []byte(bootID()))
		sb, err := tx.CreateBucket(bktStreams)
		if err != nil {
			return err
		}
		for _, name := range opts.Streams {
			b, err := sb.CreateBucket([]byte(name))
			if err != nil {
				return err
			}
			b.Put(keyLength, u64(0))
			b.Put(keyStart, u64(0))
			segs, err := b.CreateBucket(bktSegs)
			if err != nil {
				return err
			}
			segs.Put(u64(0), nil)
			if _, err := b.CreateBucket(bktMarks); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, filepath.Join(dir, indexName), unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			err = ErrExists
		}
		return fail(err)
	}
	w.db.NoSync = false
	if opts.DeferCreateSync {
		w.createSync = true
	} else if err := atomicfile.SyncDir(dir); err != nil {
		return fail(err)
	}
	w.start()
	return w, nil
}

// Relocate tells w that its directory has been renamed to dir: it was
// created in a staging place and moved (a warm shim prepares its journal
// before it knows its session). Files w makes from then on go to dir. It
// changes nothing and fails unless dir holds w's own index.db, so a wrong
// path cannot split a journal in two.
//
// The rename is the caller's, and so is its durability: w's sync points
// make dir's entries durable, not dir's own entry in its parent.
func (w *Writer) Relocate(dir string) error {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.state != nil {
		return w.state
	}
	fi, err := os.Stat(filepath.Join(dir, indexName))
	if err != nil {
		return fmt.Errorf("relocate journal to %s: %w", dir, err)
	}
	if w.index == nil || !os.SameFile(fi, w.index) {
		return fmt.Errorf("relocate journal to %s: it holds another journal's index", dir)
	}
	// Under every stream's lock too: a segment roll reads w.dir.
	for _, s := range w.order {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	w.dir = dir
	for _, s := range w.order {
		s.dir = filepath.Join(dir, s.name)
	}
	return nil
}

func (w *Writer) start() {
	// Identifies index.db for Relocate; nil (refusing) if it cannot be read.
	w.index, _ = os.Stat(filepath.Join(w.dir, indexName))
	w.stop = make(chan struct{})
	w.done = make(chan struct{})
	go w.syncer()
}

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

func (w *Writer) stream(name string) (*wstream, error) {
	s := w.streams[name]
	if s == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownStream, name)
	}
	return s, nil
}

// Dir returns the journal directory.
func (w *Writer) Dir() string { return w.dir }

// Streams returns the journal's stream names.
func (w *Writer) Streams() []string { return append([]string(nil), w.opts.Streams...) }

// StreamWriter returns an io.Writer appending to stream. It panics if
// stream is not one of the journal's streams (a programming error).
func (w *Writer) StreamWriter(stream string) io.Writer {
	s, err := w.stream(stream)
	if err != nil {
		panic(err)
	}
	return streamWriter{w, s}
}

type streamWriter struct {
	w *Writer
	s *wstream
}

func (sw streamWriter) Write(p []byte) (int, error) { return sw.w.write(sw.s, p) }

// Write appends p to stream with write(2) and no user-space buffering: the
// bytes are visible to readers, and survive a kill of the writer process,
// when Write returns. They are durable against power loss after the next
// sync point (see the package documentation). It returns ErrFinished after
// Finish, ErrClosed after Close.
func (w *Writer) Write(stream string, p []byte) (int, error) {
	s, err := w.stream(stream)
	if err != nil {
		return 0, err
	}
	return w.write(s, p)
}

func (w *Writer) write(s *wstream, p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	now := time.Now()
	if s.lastMark.IsZero() || now.Sub(s.lastMark) >= w.opts.MarkInterval {
		n := now.UnixNano()
		if n <= s.lastNano {
			n = s.lastNano + 1
		}
		s.lastMark, s.lastNano = now, n
		s.marks = append(s.marks, mark{n, s.length})
	}
	total := 0
	for len(p) > 0 {
		room := w.opts.SegmentBytes - (s.length - s.base)
		if room <= 0 {
			if err := w.roll(s); err != nil {
				return total, fmt.Errorf("write %s: %w", s.name, err)
			}
			continue
		}
		c := p
		if int64(len(c)) > room {
			c = c[:room]
		}
		n, err := s.f.Write(c)
		s.length += int64(n)
		total += n
		s.dirty = s.dirty || n > 0
		if err != nil {
			return total, fmt.Errorf("write %s: %w", s.name, err)
		}
		p = p[n:]
	}
	return total, nil
}

// roll seals the active segment and starts a new one at the stream's end,
// then applies retention. s.mu is held. The sealed file is fsynced and
// closed by the next flush, off the write path; segments created after the
// last index commit are beyond the index's synced length, which is what
// recovery after a power loss trusts.
func (w *Writer) roll(s *wstream) error {
	f, err := os.OpenFile(segPath(w.dir, s.name, s.length), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("roll segment: %w", err)
	}
	s.sealed = append(s.sealed, s.f)
	s.f, s.base = f, s.length
	s.segs = append(s.segs, s.length)
	s.created = append(s.created, s.length)
	if r := w.opts.RetainBytes; r > 0 {
		for len(s.segs) > 1 && s.length-s.segs[0] > r {
			err := os.Remove(segPath(w.dir, s.name, s.segs[0]))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				break // retried on the next roll
			}
			s.removed = append(s.removed, s.segs[0])
			s.segs = s.segs[1:]
		}
	}
	return nil
}

// Len returns the current length (end offset) of stream, or -1 for an
// unknown stream.
func (w *Writer) Len(stream string) int64 {
	s, err := w.stream(stream)
	if err != nil {
		return -1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.length
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

// ReserveBytes is the space a live journal holds in its reserve file for
// Finish: the final index commit (a few bbolt pages) and exit.json, with
// room to spare. The reserve also holds the inode exit.json's temporary
// name takes. A journal that has no reserve (one recovered after a crash
// of its writer) finishes as well when there is space.
const ReserveBytes = 64 << 10

// reserveBytes is ReserveBytes; BenchmarkCreateFinish sets it to 0 for
// its baseline (a journal without a reserve).
var reserveBytes int64 = ReserveBytes

// allocReserve allocates dir's reserve file: blocks the file system
// really sets aside (fallocate, not a sparse file), so its removal frees
// them. A file system that cannot fallocate gets the bytes written.
func allocReserve(dir string) error {
	if reserveBytes == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, ReserveFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("allocate reserve: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, reserveBytes)
	if errors.Is(err, unix.EOPNOTSUPP) {
		_, err = f.Write(make([]byte, reserveBytes))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("allocate reserve: %w", err)
	}
	return nil
}

// HasReserve reports whether the journal still holds its reserve file
// (see ReserveBytes), which Finish frees before it writes.
func (w *Writer) HasReserve() bool {
	_, err := os.Lstat(filepath.Join(w.dir, ReserveFile))
	return err == nil
}

// releaseReserve gives dir's reserve to Finish: renamed to exit.json's
// temporary name, so the inode publishExit needs is already held (no one
// else can take it), and shrunk to one block, so the rest of its space is
// free for the final index commit. A journal without a reserve is left
// as it is.
func releaseReserve(dir string) {
	tmp := filepath.Join(dir, exitTmpName)
	if os.Rename(filepath.Join(dir, ReserveFile), tmp) == nil {
		os.Truncate(tmp, exitBlock)
	}
}

// exitBlock is what releaseReserve keeps of the reserve for exit.json.
const exitBlock = 4096
