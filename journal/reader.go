package journal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Reader reads one stream from a cursor. It holds one segment file open
// and, once a follow Reader first waits, either a registration with a
// shared Watcher (NewReaderWatched) or one inotify descriptor of its own
// (NewReader); it starts no goroutine (context cancellation of a wait uses
// context.AfterFunc, which is stopped before ReadContext returns).
// Per-reader memory is a small struct plus, with its own descriptor, a
// 1 KiB event buffer. If the kernel refuses the descriptor or the watches
// (EMFILE, ENFILE, ENOSPC, ENOMEM), the Reader polls instead (see Watcher).
//
// A Reader is not safe for concurrent use (cancel a blocked ReadContext with
// its context). The owner must call Close.
type Reader struct {
	dir    string // journal directory
	sdir   string // stream directory
	stream string
	follow bool

	f    *os.File // current segment
	base int64    // first offset of f
	off  int64    // next offset to read

	exitKnown bool
	exitLen   int64 // final length of the stream once exitKnown
	dead      bool  // writer found gone while no exit record was present

	armed     bool          // the first wait registered for changes
	w         *Watcher      // shared watcher; nil: an inotify instance of its own
	sub       *subscription // registration with w while armed
	poll      time.Duration // > 0: no inotify, re-check at this interval
	ino       *os.File      // own inotify instance
	wdJournal int32
	needCheck bool // journal dir changed: re-check exit.json and liveness
	evbuf     []byte
	closed    bool
}

// NewReader opens stream at cursor. A cursor before the first retained
// byte returns ErrTruncated, one beyond the current end (or negative)
// ErrInvalidCursor, both wrapped in a *CursorError. follow selects whether
// ReadContext waits for more bytes at the end (see ReadContext).
func (j *Journal) NewReader(stream string, cursor int64, follow bool) (*Reader, error) {
	return j.NewReaderWatched(nil, stream, cursor, follow)
}

// NewReaderWatched is NewReader for a Reader woken by w, shared with any
// number of other Readers, instead of an inotify instance of its own. A
// nil w is NewReader. w must outlive the Reader.
func (j *Journal) NewReaderWatched(w *Watcher, stream string, cursor int64, follow bool) (*Reader, error) {
	sdir, err := j.streamDir(stream)
	if err != nil {
		return nil, err
	}
	r := &Reader{dir: j.dir, sdir: sdir, stream: stream, follow: follow, off: cursor, w: w}
	if j.segBytes > 0 && cursor >= 0 {
		// Fast path, independent of the journal's size: segments are
		// aligned, so the one holding cursor is named cursor rounded down
		// to SegmentBytes. If it exists and reaches cursor it is the right
		// one (and cursor >= start, since retention removes oldest first).
		// Anything else (removed, beyond the end, the end on a boundary
		// before the writer rolled) takes the listing path below.
		base := cursor / j.segBytes * j.segBytes
		if f, err := os.Open(filepath.Join(sdir, segName(base))); err == nil {
			st, err := f.Stat()
			if err == nil && cursor-base <= st.Size() {
				r.f, r.base = f, base
				return r, nil
			}
			f.Close()
		}
	}
	// Retention can remove the segment between listing and opening; list
	// again and the cursor is then before the new start.
	for range 8 {
		start, end, segs, err := bounds(sdir)
		if err != nil {
			return nil, err
		}
		if cursor < 0 || cursor > end {
			return nil, &CursorError{stream, cursor, start, end, ErrInvalidCursor}
		}
		if cursor < start {
			return nil, &CursorError{stream, cursor, start, end, ErrTruncated}
		}
		base := segmentFor(segs, cursor)
		f, err := os.Open(filepath.Join(sdir, segName(base)))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open segment: %w", err)
		}
		r.f, r.base = f, base
		return r, nil
	}
	return nil, fmt.Errorf("open reader %s: unstable directory", sdir)
}

// Offset returns the next offset the Reader will read: a cursor to resume
// from.
func (r *Reader) Offset() int64 { return r.off }

// Read is ReadContext(context.Background(), p).
func (r *Reader) Read(p []byte) (int, error) { return r.ReadContext(context.Background(), p) }

// ReadContext reads the next bytes at the Reader's offset.
//
// A non-follow Reader returns io.EOF at the stream's current end. A follow
// Reader blocks until bytes arrive (woken by inotify, never a sleep loop)
// and returns io.EOF exactly at the final length in the exit record,
// ErrLost once every byte is read and the writer is gone without an exit
// record, or ctx.Err(). Either returns ErrTruncated (in a *CursorError)
// when retention removed the next bytes before the Reader got to them.
func (r *Reader) ReadContext(ctx context.Context, p []byte) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if r.exitKnown {
			if r.off >= r.exitLen {
				return 0, io.EOF
			}
			if rem := r.exitLen - r.off; int64(len(p)) > rem {
				p = p[:rem]
			}
		}
		n, err := r.readAvail(p)
		if n > 0 || err != nil {
			return n, err
		}
		if !r.follow {
			return 0, io.EOF
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if !r.armed {
			// Arm before the checks below, then read again: a change after
			// the arm is queued on the descriptor (or left as a pending
			// wake-up by the Watcher), so no wake-up is lost.
			if err := r.arm(); err != nil {
				return 0, err
			}
			continue
		}
		if r.exitKnown {
			// exit.json is published after the last byte, so the bytes up
			// to exitLen must be in the files.
			return 0, fmt.Errorf("read %s at %d: %w: exit record names %d bytes", r.stream, r.off, ErrCorrupt, r.exitLen)
		}
		if r.dead {
			return 0, fmt.Errorf("read %s at %d: %w", r.stream, r.off, ErrLost)
		}
		if r.needCheck {
			r.needCheck = false
			// Liveness first: exit.json is renamed in before the writer
			// releases index.db, so "no lock" then "no exit.json" is lost.
			alive, err := writerAlive(r.dir)
			if err != nil {
				return 0, err
			}
			e, ok, err := readExit(r.dir)
			if err != nil {
				return 0, err
			}
			if ok {
				r.exitKnown, r.exitLen = true, e.Lengths[r.stream]
				continue
			}
			if !alive {
				r.dead = true
				continue // read once more: bytes written just before death
			}
		}
		if err := r.wait(ctx); err != nil {
			return 0, err
		}
	}
}

// readAvail reads what is on disk at r.off, moving to the next segment when
// the current one is sealed. It returns 0, nil at the live end.
func (r *Reader) readAvail(p []byte) (int, error) {
	for {
		n, err := r.f.ReadAt(p, r.off-r.base)
		if n > 0 {
			r.off += int64(n)
			return n, nil
		}
		if err != nil && err != io.EOF {
			return 0, fmt.Errorf("read segment: %w", err)
		}
		if moved, err := r.advance(); err != nil || !moved {
			return 0, err
		}
	}
}

// advance is called when the current segment holds no byte at r.off. It
// opens the successor segment and returns true if the writer rolled,
// returns false at the live end, and ErrTruncated (in a *CursorError)
// when retention removed the bytes at r.off.
func (r *Reader) advance() (bool, error) {
	// The successor segment, if the writer rolled, is named r.off.
	if r.off > r.base {
		if switched, err := r.openNext(); err != nil || switched {
			return switched, err
		}
	}
	// No successor. If our segment is still linked we are at the live
	// end. Retention only removes sealed segments, whose successor
	// exists, so an unlinked segment with no successor means the
	// successor was removed too: the reader fell behind retention.
	var st unix.Stat_t
	if err := unix.Fstat(int(r.f.Fd()), &st); err != nil {
		return false, fmt.Errorf("stat segment: %w", err)
	}
	if st.Nlink > 0 {
		return false, nil
	}
	if r.off > r.base {
		if switched, err := r.openNext(); err != nil || switched {
			return switched, err
		}
	}
	start, end, _, err := bounds(r.sdir)
	if err != nil {
		return false, err
	}
	if start <= r.off {
		return false, fmt.Errorf("read %s at %d: %w: segment missing", r.stream, r.off, ErrCorrupt)
	}
	return false, &CursorError{r.stream, r.off, start, end, ErrTruncated}
}

func (r *Reader) openNext() (bool, error) {
	nf, err := os.Open(filepath.Join(r.sdir, segName(r.off)))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open segment: %w", err)
	}
	r.f.Close()
	r.f, r.base = nf, r.off
	return true, nil
}

// Watched events. Stream dir: new segment, bytes appended, removals.
// Journal dir: exit.json renamed in, index.db closed by a dying writer.
const (
	streamEvents  = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_MOVED_TO | unix.IN_DELETE
	journalEvents = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_DELETE
)

// inotifyInit is unix.InotifyInit1; tests inject failures.
var inotifyInit = unix.InotifyInit1

// arm registers the Reader for changes: with its Watcher, else with an
// inotify instance of its own; it polls if the kernel refuses either.
func (r *Reader) arm() error {
	if r.w != nil {
		sub, err := r.w.subscribe(r.sdir, r.dir)
		var pe *pollError
		switch {
		case errors.As(err, &pe):
			r.w.fellBack(pe.dir, pe.err)
			r.startPolling(r.w.opts.PollInterval)
		case err != nil:
			return err
		default:
			r.sub = sub
		}
	} else if err := r.watchOwn(); pollable(err) {
		// Out of instances or watches: poll rather than fail the follower.
		r.startPolling(DefaultPollInterval)
	} else if err != nil {
		return err
	}
	r.armed, r.needCheck = true, true
	return nil
}

// watchOwn sets up the Reader's own inotify instance on its two directories.
func (r *Reader) watchOwn() error {
	fd, err := inotifyInit(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, r.sdir, streamEvents); err != nil {
		unix.Close(fd)
		return fmt.Errorf("watch %s: %w", r.sdir, err)
	}
	wd, err := unix.InotifyAddWatch(fd, r.dir, journalEvents)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("watch %s: %w", r.dir, err)
	}
	// A non-blocking descriptor joins the runtime poller, so Read parks the
	// goroutine and honours deadlines.
	r.ino = os.NewFile(uintptr(fd), "inotify")
	r.wdJournal = int32(wd)
	r.evbuf = make([]byte, 1024)
	return nil
}

// startPolling makes the Reader re-check every d instead of waiting for
// inotify: the kernel refused an instance or a watch, or the Watcher lost
// it. Slower, never wrong.
func (r *Reader) startPolling(d time.Duration) {
	if r.sub != nil {
		r.w.unsubscribe(r.sub)
		r.sub = nil
	}
	r.poll = d
}

// wait blocks until at least one change may have happened or ctx is done.
func (r *Reader) wait(ctx context.Context) error {
	switch {
	case r.poll > 0:
		t := time.NewTimer(r.poll)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		// Nothing tells a poller what changed: look at everything.
		r.needCheck = true
		return nil
	case r.sub != nil:
		s := r.sub
		select {
		case <-s.c:
		case <-ctx.Done():
			return ctx.Err()
		}
		if s.journal.Swap(false) {
			r.needCheck = true
		}
		if s.lost.Load() {
			// The watch is gone (directory removed, Watcher closed): what
			// changed since is unknown, so re-check and poll from now on.
			r.startPolling(r.w.opts.PollInterval)
			r.needCheck = true
		}
		return nil
	}
	for {
		r.ino.SetReadDeadline(time.Time{})
		stop := context.AfterFunc(ctx, func() { r.ino.SetReadDeadline(time.Unix(1, 0)) })
		n, err := r.ino.Read(r.evbuf)
		stop()
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue // a late AfterFunc from an earlier call
			}
			return fmt.Errorf("inotify read: %w", err)
		}
		forEachEvent(r.evbuf[:n], func(wd int32, mask uint32) {
			if wd == r.wdJournal || mask&unix.IN_Q_OVERFLOW != 0 {
				r.needCheck = true
			}
		})
		return nil
	}
}

// Close releases the Reader's descriptors. It is idempotent.
func (r *Reader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	var err error
	if r.f != nil {
		err = r.f.Close()
	}
	if r.ino != nil {
		if cerr := r.ino.Close(); err == nil {
			err = cerr
		}
	}
	if r.sub != nil {
		r.w.unsubscribe(r.sub)
		r.sub = nil
	}
	return err
}
