package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultPollInterval is how often a follow Reader that could not get an
// inotify watch re-checks its stream (see Watcher).
const DefaultPollInterval = 100 * time.Millisecond

// WatcherOptions configure a Watcher. The zero value is usable.
type WatcherOptions struct {
	// PollInterval is how often a Reader that could not get a watch
	// re-checks its stream; 0 means DefaultPollInterval.
	PollInterval time.Duration

	// OnPoll, if set, is called each time a Reader falls back to polling:
	// dir is the directory that could not be watched ("" when the Watcher
	// has no inotify instance) and err says why. It runs on the Reader's
	// goroutine and must not block.
	OnPoll func(dir string, err error)
}

// WatcherStats is a snapshot of a Watcher's state.
type WatcherStats struct {
	Watches     int    // inotify watches held: one per watched directory
	Readers     int    // Readers currently woken by the Watcher
	DirWatches  int    // DirWatches currently woken by the Watcher (no Readers)
	Overflows   uint64 // IN_Q_OVERFLOW events seen (every Reader was woken)
	Fallbacks   uint64 // Readers that fell back to polling
	Unavailable error  // why the Watcher has no inotify instance; nil when it has one
}

// Watcher wakes any number of follow Readers from one inotify instance and
// one goroutine, instead of one instance per Reader (the kernel allows
// fs.inotify.max_user_instances, 128 by default, per user). Readers made
// with Journal.NewReaderWatched register the stream directory and the
// journal directory when they first wait; a directory is watched once,
// however many Readers follow it, and its watch is removed when the last
// of them closes.
//
// A Reader is woken through its own 1-buffered channel: the Watcher's
// goroutine never blocks on a Reader, and a Reader registers before it
// checks the files, so a change after registration always leaves a wake-up
// behind (a Reader may see a spurious one, never miss one). On
// IN_Q_OVERFLOW every Reader is woken and re-checks everything.
//
// When the kernel refuses (no inotify instance: EMFILE, ENFILE, ENOMEM; no
// watch: ENOSPC at fs.inotify.max_user_watches, ENOMEM), the Readers
// affected poll every PollInterval instead of failing: slower, still
// byte-exact. So do Readers whose watch the kernel dropped (IN_IGNORED)
// and Readers still waiting when the Watcher is closed.
//
// A Watcher is safe for concurrent use. The owner must call Close, after
// the Readers that use it are closed; Close is idempotent.
type Watcher struct {
	opts WatcherOptions
	f    *os.File // the inotify instance, non-blocking, in the runtime poller; nil if unavailable
	fd   int      // f's descriptor; used only under mu while !closed
	err  error    // why f is nil, or why run stopped early; guarded by mu once run starts
	done chan struct{}
	once sync.Once

	mu      sync.Mutex // guards watches, subs, dirSubs, closed and every subscription's watches
	watches map[int32]*watch
	subs    map[*subscription]struct{} // the follow Readers' (Stats.Readers)
	dirSubs map[*subscription]struct{} // the DirWatches' (Stats.DirWatches)
	closed  bool

	addWatch func(fd int, path string, mask uint32) (int, error) // unix.InotifyAddWatch; tests inject failures

	overflows atomic.Uint64
	fallbacks atomic.Uint64
}

// watch is one inotify watch descriptor and the subscriptions it wakes.
type watch struct {
	wd   int32
	subs map[*subscription]bool // value: journal-directory role
}

// subscription is one Reader's registration.
type subscription struct {
	c       chan struct{} // 1-buffered wake-up
	journal atomic.Bool   // the journal directory changed since the Reader last looked
	lost    atomic.Bool   // a watch is gone (IN_IGNORED, Close): poll instead
	watches []*watch      // guarded by Watcher.mu
}

func (s *subscription) wake() {
	select {
	case s.c <- struct{}{}:
	default: // a wake-up is already pending; the Reader re-checks everything
	}
}

// NewWatcher starts a Watcher. It never fails: if the kernel refuses an
// inotify instance, the Watcher's Readers poll (see Watcher), Stats says
// why, and OnPoll is called for each Reader that polls.
func NewWatcher(opts WatcherOptions) *Watcher {
	return newWatcher(opts, unix.InotifyInit1)
}

func newWatcher(opts WatcherOptions, initFn func(int) (int, error)) *Watcher {
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	w := &Watcher{
		opts:     opts,
		addWatch: unix.InotifyAddWatch,
		done:     make(chan struct{}),
		watches:  map[int32]*watch{},
		subs:     map[*subscription]struct{}{},
		dirSubs:  map[*subscription]struct{}{},
	}
	fd, err := initFn(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		w.err = fmt.Errorf("inotify: %w", err)
		close(w.done)
		return w
	}
	w.fd = fd
	w.f = os.NewFile(uintptr(fd), "inotify")
	go w.run()
	return w
}

// Stats returns a snapshot of the Watcher's state.
func (w *Watcher) Stats() WatcherStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return WatcherStats{
		Watches:     len(w.watches),
		Readers:     len(w.subs),
		DirWatches:  len(w.dirSubs),
		Overflows:   w.overflows.Load(),
		Fallbacks:   w.fallbacks.Load(),
		Unavailable: w.err,
	}
}

// Close stops the Watcher's goroutine, waits for it and closes the inotify
// instance. Readers still waiting are woken and poll from then on. It is
// idempotent and returns nil.
func (w *Watcher) Close() error {
	w.once.Do(func() {
		w.mu.Lock()
		w.closed = true
		w.loseAll()
		w.mu.Unlock()
		if w.f != nil {
			w.f.Close() // wakes run's Read with os.ErrClosed
			<-w.done
		}
	})
	return nil
}

// loseAll makes every subscribed Reader poll. Called with mu held.
func (w *Watcher) loseAll() {
	for _, subs := range []map[*subscription]struct{}{w.subs, w.dirSubs} {
		for s := range subs {
			s.lost.Store(true)
			s.wake()
		}
		clear(subs)
	}
	clear(w.watches)
}

// pollError is returned by subscribe when the Reader should poll: dir
// could not be watched ("" for the whole Watcher) because of err.
type pollError struct {
	dir string
	err error
}

func (e *pollError) Error() string { return fmt.Sprintf("poll %s: %v", e.dir, e.err) }
func (e *pollError) Unwrap() error { return e.err }

// subscribe registers a Reader of the stream directory sdir in the journal
// directory dir. A *pollError means the Reader should poll; any other
// error is the Reader's.
func (w *Watcher) subscribe(sdir, dir string) (*subscription, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, ErrClosed
	}
	if w.err != nil {
		return nil, &pollError{"", w.err}
	}
	s := &subscription{c: make(chan struct{}, 1)}
	for _, d := range []struct {
		path        string
		mask        uint32
		journalRole bool
	}{{sdir, streamEvents, false}, {dir, journalEvents, true}} {
		if err := w.add(s, d.path, d.mask, d.journalRole); err != nil {
			w.dropLocked(s)
			if pollable(err) {
				return nil, &pollError{d.path, err}
			}
			return nil, err
		}
	}
	w.subs[s] = struct{}{}
	return s, nil
}

// add watches path for s. inotify gives one descriptor per inode and
// instance, so Readers of one directory share it; IN_MASK_ADD keeps an
// aliased directory's other events. Called with mu held.
func (w *Watcher) add(s *subscription, path string, mask uint32, journalRole bool) error {
	wd, err := w.addWatch(w.fd, path, mask|unix.IN_MASK_ADD)
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	wt := w.watches[int32(wd)]
	if wt == nil {
		wt = &watch{wd: int32(wd), subs: map[*subscription]bool{}}
		w.watches[wt.wd] = wt
	}
	wt.subs[s] = wt.subs[s] || journalRole
	s.watches = append(s.watches, wt)
	return nil
}

// unsubscribe removes a Reader's registration, and each watch it was the
// last Reader of. It is idempotent. Like closing a Reader's own inotify
// descriptor, it wakes a wait in progress, which then finds the Reader
// closed.
func (w *Watcher) unsubscribe(s *subscription) {
	w.mu.Lock()
	w.dropLocked(s)
	w.mu.Unlock()
	s.lost.Store(true)
	s.wake()
}

func (w *Watcher) dropLocked(s *subscription) {
	delete(w.subs, s)
	delete(w.dirSubs, s)
	for _, wt := range s.watches {
		delete(wt.subs, s)
		// A watch no longer in the map was dropped by the kernel
		// (IN_IGNORED) or by Close: its descriptor is not ours to remove.
		if len(wt.subs) == 0 && !w.closed && w.watches[wt.wd] == wt {
			delete(w.watches, wt.wd)
			unix.InotifyRmWatch(w.fd, uint32(wt.wd))
		}
	}
	s.watches = nil
}

// fellBack records that a Reader polls because of err.
func (w *Watcher) fellBack(dir string, err error) {
	w.fallbacks.Add(1)
	if w.opts.OnPoll != nil {
		w.opts.OnPoll(dir, err)
	}
}

// run reads events until Close and wakes the Readers they concern.
func (w *Watcher) run() {
	defer close(w.done)
	// Room for many events per read: the queue is per instance now, shared
	// by every Reader.
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			w.mu.Lock()
			if !w.closed {
				// Not expected from inotify; keep every Reader correct.
				w.err = fmt.Errorf("inotify read: %w", err)
				w.loseAll()
			}
			w.mu.Unlock()
			return
		}
		w.dispatch(buf[:n])
	}
}

// dispatch wakes the Readers concerned by a buffer of events.
func (w *Watcher) dispatch(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	forEachEvent(b, w.event)
}

// forEachEvent calls fn with the watch descriptor and mask of every
// inotify event in b, a buffer filled by one read of an inotify instance.
func forEachEvent(b []byte, fn func(wd int32, mask uint32)) {
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:4]))
		mask := binary.NativeEndian.Uint32(b[4:8])
		nameLen := binary.NativeEndian.Uint32(b[12:16])
		fn(wd, mask)
		adv := unix.SizeofInotifyEvent + int(nameLen)
		if adv > len(b) {
			break
		}
		b = b[adv:]
	}
}

// event handles one event. Called with mu held.
func (w *Watcher) event(wd int32, mask uint32) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		// Events were dropped: nobody knows what changed, so everyone
		// re-checks the files and the journal directory.
		w.overflows.Add(1)
		for _, subs := range []map[*subscription]struct{}{w.subs, w.dirSubs} {
			for s := range subs {
				s.journal.Store(true)
				s.wake()
			}
		}
		return
	}
	wt := w.watches[wd]
	if wt == nil {
		return // removed by unsubscribe; events still queued for it
	}
	for s, journalRole := range wt.subs {
		if journalRole {
			s.journal.Store(true)
		}
		if mask&unix.IN_IGNORED != 0 {
			s.lost.Store(true)
		}
		s.wake()
	}
	if mask&unix.IN_IGNORED != 0 {
		// The kernel removed the watch (directory deleted, file system
		// unmounted): its Readers poll from now on.
		delete(w.watches, wd)
	}
}

// pollable reports whether err from setting up inotify means "the kernel
// is out of instances, watches or memory", which a Reader survives by
// polling, rather than a fault of its own (a missing directory).
func pollable(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) ||
		errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM)
}

// DirWatch wakes its owner when a journal directory changes: exit.json
// renamed in, index.db closed by a dying writer, a file created or
// removed. It shares its Watcher's inotify instance and the directory's
// watch with the follow Readers of that journal, but is no Reader: Stats
// counts it under DirWatches, not Readers. runnerd's sessions manager
// holds one per running session to record its exit once.
//
// A wake-up may be spurious, never missed once WatchDir has returned: the
// owner re-checks the files after each. When Lost reports true (the
// kernel refused or dropped the watch, or the Watcher closed), no more
// wake-ups come and the owner must poll. Close is idempotent; the owner
// must call it.
type DirWatch struct {
	w *Watcher
	s *subscription
}

// WatchDir watches the journal directory dir. When the kernel refuses a
// watch or an instance, it returns a DirWatch that is Lost from the start
// (OnPoll is told), so the owner polls; an error is returned only for dir
// itself (missing, not a directory) or a closed Watcher (ErrClosed).
func (w *Watcher) WatchDir(dir string) (*DirWatch, error) {
	s := &subscription{c: make(chan struct{}, 1)}
	d := &DirWatch{w: w, s: s}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, ErrClosed
	}
	pollDir, why := "", w.err
	if why == nil {
		if err := w.add(s, dir, journalEvents, true); err != nil {
			w.dropLocked(s)
			if !pollable(err) {
				w.mu.Unlock()
				return nil, err
			}
			pollDir, why = dir, err
		} else {
			w.dirSubs[s] = struct{}{}
		}
	}
	w.mu.Unlock()
	if why != nil {
		s.lost.Store(true)
		w.fellBack(pollDir, why) // outside mu, as a Reader's: OnPoll may read Stats
	}
	return d, nil
}

// C is the DirWatch's wake-up channel (1-buffered).
func (d *DirWatch) C() <-chan struct{} { return d.s.c }

// Lost reports whether the DirWatch no longer wakes its owner, which must
// then poll.
func (d *DirWatch) Lost() bool { return d.s.lost.Load() }

// Close removes the DirWatch, and the directory's watch if it was the
// last to use it.
func (d *DirWatch) Close() {
	d.w.unsubscribe(d.s)
}
