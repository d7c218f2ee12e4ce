package journal

// The Writer: Create, Relocate and the write path (Write, StreamWriter,
// segment rolls). Sync points are in sync.go, the end in finish.go.

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
