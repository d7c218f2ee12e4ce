package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/ostest"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// followAll reads r to its end (io.EOF) under a deadline.
func followAll(ctx context.Context, r *Reader) ([]byte, error) {
	var out bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := r.ReadContext(ctx, buf)
		out.Write(buf[:n])
		if err == io.EOF {
			return out.Bytes(), nil
		}
		if err != nil {
			return out.Bytes(), err
		}
	}
}

// followStdout creates a journal of one stream, stdout, and a follow
// Reader of it from 0 woken by w (nil: its own inotify instance). The
// Reader is closed at cleanup.
func followStdout(t *testing.T, w *Watcher) (*Writer, *Reader) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "j")
	wr := mustCreate(t, dir, Options{Streams: []string{"stdout"}})
	r, err := mustOpen(t, dir).NewReaderWatched(w, "stdout", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return wr, r
}

// mustFollow reads r to its end under a 10 s deadline and fails unless it
// read exactly want.
func mustFollow(t *testing.T, r *Reader, want []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := followAll(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d", len(got), len(want))
	}
}

// inotifyWatches counts the live watches of the inotify instance fd, from
// /proc/self/fdinfo: the kernel's view, not the Watcher's bookkeeping.
func inotifyWatches(t testing.TB, fd int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "inotify wd:") {
			n++
		}
	}
	return n
}

// inotifyInstances counts this process's inotify descriptors.
var inotifyInstances = ostest.InotifyInstances

// arm waits for r to register: a read that times out at the live end.
func arm(t testing.TB, r *Reader) {
	t.Helper()
	// ReadContext checks ctx before it arms, so on a loaded machine a
	// short deadline can pass first: read again until the Reader armed.
	for !r.armed {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		_, err := r.ReadContext(ctx, make([]byte, 1))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("read at the live end: got %v, want %v", err, context.DeadlineExceeded)
		}
	}
}

// 300 follow Readers on one Watcher, over 25 journals written concurrently,
// all wake and read exactly their stream's bytes and its end; the process
// holds one inotify instance, with one watch per directory.
func TestWatcherManyReaders(t *testing.T) {
	const (
		journals   = 25
		perStream  = 6 // 25 journals × 2 streams × 6 = 300 Readers
		rounds     = 20
		chunk      = 97
		streamSize = rounds * chunk
	)
	streams := []string{"stdout", "stderr"}
	leaks := goleak.IgnoreCurrent()
	before := inotifyInstances(t)
	w := NewWatcher(WatcherOptions{OnPoll: func(dir string, err error) { t.Errorf("fell back to polling: %s: %v", dir, err) }})
	root := t.TempDir()
	writers := make([]*Writer, journals)
	var readers []*Reader
	type want struct {
		r      *Reader
		stream int
	}
	var wants []want
	for i := range writers {
		dir := filepath.Join(root, fmt.Sprint(i))
		wr, err := Create(dir, Options{Streams: streams})
		if err != nil {
			t.Fatal(err)
		}
		writers[i] = wr
		j := mustOpen(t, dir)
		for s, name := range streams {
			for range perStream {
				r, err := j.NewReaderWatched(w, name, 0, true)
				if err != nil {
					t.Fatal(err)
				}
				readers = append(readers, r)
				wants = append(wants, want{r, s})
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(wants))
	var armedN atomic.Int32
	for _, wt := range wants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			arm(t, wt.r)
			armedN.Add(1)
			got, err := followAll(ctx, wt.r)
			if err != nil {
				errs <- fmt.Errorf("reader of %s: %w", streams[wt.stream], err)
				return
			}
			if wantB := patternBytes(wt.stream, 0, streamSize); !bytes.Equal(got, wantB) {
				errs <- fmt.Errorf("reader of %s: got %d bytes, want %d (the pattern)", streams[wt.stream], len(got), len(wantB))
			}
		}()
	}
	for armedN.Load() < int32(len(wants)) {
		time.Sleep(time.Millisecond)
	}
	if got, want := w.Stats().Watches, journals*3; got != want {
		t.Errorf("watches: got %d, want %d (2 stream dirs + the journal dir per journal)", got, want)
	}
	if got, want := inotifyWatches(t, w.fd), journals*3; got != want {
		t.Errorf("kernel watches: got %d, want %d", got, want)
	}
	if got, want := inotifyInstances(t), before+1; got != want {
		t.Errorf("inotify instances: got %d, want %d", got, want)
	}
	for k := range rounds {
		for _, wr := range writers {
			for s, name := range streams {
				if _, err := wr.Write(name, patternBytes(s, int64(k*chunk), chunk)); err != nil {
					t.Fatal(err)
				}
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
	for _, wr := range writers {
		if err := wr.Finish(Exit{Reason: ReasonExited}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, r := range readers {
		r.Close()
	}
	if st := w.Stats(); st.Watches != 0 || st.Readers != 0 {
		t.Errorf("after closing every Reader: %d watches, %d readers, want none", st.Watches, st.Readers)
	}
	if got := inotifyWatches(t, w.fd); got != 0 {
		t.Errorf("kernel watches after closing every Reader: got %d, want 0", got)
	}
	for _, wr := range writers {
		wr.Close()
	}
	w.Close()
	w.Close() // idempotent
	if got := inotifyInstances(t); got != before {
		t.Errorf("inotify instances after Close: got %d, want %d", got, before)
	}
	goleak.VerifyNone(t, leaks)
}

// Readers opening and closing in a loop leave no watch behind: the kernel
// lists exactly the directories live Readers follow.
func TestWatcherRefcount(t *testing.T) {
	w := NewWatcher(WatcherOptions{})
	defer w.Close()
	dir := filepath.Join(t.TempDir(), "j")
	wr := mustCreate(t, dir, Options{Streams: []string{"stdout", "stderr"}})
	j := mustOpen(t, dir)
	check := func(when string, want int) {
		t.Helper()
		if got := inotifyWatches(t, w.fd); got != want {
			t.Fatalf("%s: kernel watches: got %d, want %d", when, got, want)
		}
		if got := w.Stats().Watches; got != want {
			t.Fatalf("%s: Watcher watches: got %d, want %d", when, got, want)
		}
	}
	open := func(stream string) *Reader {
		t.Helper()
		_, end, err := j.Bounds(stream)
		if err != nil {
			t.Fatal(err)
		}
		r, err := j.NewReaderWatched(w, stream, end, true)
		if err != nil {
			t.Fatal(err)
		}
		arm(t, r)
		return r
	}
	for i := range 100 {
		a := open("stdout")
		check("one reader", 2)
		b := open("stdout")
		check("two readers of one stream", 2)
		c := open("stderr")
		check("a reader of each stream", 3)
		a.Close()
		check("after closing one of two", 3)
		c.Close()
		check("after closing stderr's only reader", 2)
		if i%10 == 0 {
			wr.Write("stdout", []byte("x")) // events for watches being removed
		}
		b.Close()
		check("after closing every reader", 0)
	}
	// Events still queued for removed watches are dropped, not delivered.
	r := open("stdout")
	defer r.Close()
	wr.Write("stdout", []byte("y"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	buf := make([]byte, 100)
	if n, err := r.ReadContext(ctx, buf); err != nil || n == 0 {
		t.Fatalf("read after write: got %d, %v", n, err)
	}
}

// event encodes one inotify event as the kernel does.
func event(wd int32, mask uint32) []byte {
	b := make([]byte, unix.SizeofInotifyEvent)
	binary.NativeEndian.PutUint32(b[0:4], uint32(wd))
	binary.NativeEndian.PutUint32(b[4:8], mask)
	return b
}

// IN_Q_OVERFLOW wakes every Reader and makes it re-check the journal
// directory, whatever it watches.
func TestWatcherOverflowWakesAll(t *testing.T) {
	w := NewWatcher(WatcherOptions{})
	defer w.Close()
	root := t.TempDir()
	var subs []*subscription
	for i := range 3 {
		dir := filepath.Join(root, fmt.Sprint(i))
		mustCreate(t, dir, Options{Streams: []string{"stdout"}})
		s, err := w.subscribe(filepath.Join(dir, "stdout"), dir)
		if err != nil {
			t.Fatal(err)
		}
		defer w.unsubscribe(s)
		subs = append(subs, s)
	}
	time.Sleep(10 * time.Millisecond) // let stray events land, then forget them
	for _, s := range subs {
		select {
		case <-s.c:
		default:
		}
		s.journal.Store(false)
	}
	w.dispatch(event(-1, unix.IN_Q_OVERFLOW))
	for i, s := range subs {
		select {
		case <-s.c:
		default:
			t.Errorf("subscription %d: not woken by IN_Q_OVERFLOW", i)
		}
		if !s.journal.Load() {
			t.Errorf("subscription %d: journal re-check not requested", i)
		}
	}
	if got := w.Stats().Overflows; got != 1 {
		t.Errorf("overflows: got %d, want 1", got)
	}
}

// A real queue overflow loses no Reader. The Watcher's goroutine is held
// off while another directory's events fill the queue past
// fs.inotify.max_queued_events; then the Reader's stream is written and
// finished, events the kernel drops. Only IN_Q_OVERFLOW can tell the
// Reader, and it reads to the exact end.
func TestWatcherOverflowReal(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Skip(err)
	}
	var max int
	fmt.Sscan(string(b), &max)
	if max > 1<<18 {
		t.Skipf("max_queued_events %d: too many events to overflow", max)
	}
	w := NewWatcher(WatcherOptions{})
	defer w.Close()
	wr, r := followStdout(t, w)
	arm(t, r)
	noise := t.TempDir()
	ns, err := w.subscribe(noise, noise)
	if err != nil {
		t.Fatal(err)
	}
	defer w.unsubscribe(ns)
	var files [2]*os.File
	for i := range files {
		if files[i], err = os.Create(filepath.Join(noise, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		defer files[i].Close()
	}

	want := patternBytes(0, 0, 1000)
	w.mu.Lock() // the goroutine blocks in dispatch (after at most one read)
	// Alternating files: consecutive events differ, so none is merged.
	// Allow for one read's worth (64 KiB) already taken by the goroutine.
	for i := range max + 4096 {
		files[i%2].WriteAt([]byte{1}, 0)
	}
	_, werr := wr.Write("stdout", want)
	ferr := wr.Finish(Exit{Reason: ReasonExited})
	w.mu.Unlock()
	if werr != nil || ferr != nil {
		t.Fatal(werr, ferr)
	}
	mustFollow(t, r, want)
	if n := w.Stats().Overflows; n == 0 {
		t.Errorf("overflows: got 0, want at least 1")
	}
}

// IN_IGNORED (the kernel dropped a watch) makes its Readers poll; they
// still read to the exact end.
func TestWatcherIgnored(t *testing.T) {
	w := NewWatcher(WatcherOptions{PollInterval: 5 * time.Millisecond})
	defer w.Close()
	wr, r := followStdout(t, w)
	arm(t, r)
	var wd int32
	w.mu.Lock()
	wd = r.sub.watches[0].wd
	w.mu.Unlock()
	w.dispatch(event(wd, unix.IN_IGNORED))
	unix.InotifyRmWatch(w.fd, uint32(wd)) // what the kernel had done
	if got := w.Stats().Watches; got != 1 {
		t.Errorf("watches after IN_IGNORED: got %d, want 1", got)
	}
	want := patternBytes(0, 0, 300)
	go func() {
		for i := range 3 {
			time.Sleep(10 * time.Millisecond)
			wr.Write("stdout", want[i*100:(i+1)*100])
		}
		wr.Finish(Exit{Reason: ReasonExited})
	}()
	mustFollow(t, r, want)
	if r.poll == 0 {
		t.Error("reader does not poll after IN_IGNORED")
	}
	r.Close()
	if got := inotifyWatches(t, w.fd); got != 0 {
		t.Errorf("kernel watches after Close: got %d, want 0", got)
	}
}

// Closing the Watcher under a waiting Reader leaves it polling, not hung.
func TestWatcherCloseUnderReader(t *testing.T) {
	w := NewWatcher(WatcherOptions{PollInterval: 5 * time.Millisecond})
	wr, r := followStdout(t, w)
	arm(t, r)
	want := patternBytes(0, 0, 200)
	go func() {
		time.Sleep(10 * time.Millisecond)
		w.Close()
		time.Sleep(10 * time.Millisecond)
		wr.Write("stdout", want)
		wr.Finish(Exit{Reason: ReasonExited})
	}()
	mustFollow(t, r, want)
}

// A live stream followed by a Reader armed after Close: ErrClosed.
func TestWatcherClosedSubscribe(t *testing.T) {
	w := NewWatcher(WatcherOptions{})
	w.Close()
	_, r := followStdout(t, w)
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("read: got %v, want ErrClosed", err)
	}
}

// When the kernel refuses inotify (no instance, no watch), follow Readers
// poll and still read exactly the bytes to the end; errors that are the
// Reader's own are still returned.
func TestWatcherFallbackPoll(t *testing.T) {
	emfile := func(int) (int, error) { return -1, unix.EMFILE }
	tests := []struct {
		name    string
		watcher func(t *testing.T, polls *atomic.Int32) *Watcher // nil: a Reader's own instance
		own     func(int) (int, error)                           // inotifyInit for a Reader's own instance
		wantErr error                                            // nil: reads the stream
	}{
		{name: "watcher without an instance (EMFILE)", watcher: func(t *testing.T, polls *atomic.Int32) *Watcher {
			return newWatcher(WatcherOptions{PollInterval: 5 * time.Millisecond, OnPoll: func(dir string, err error) {
				if !errors.Is(err, unix.EMFILE) || dir != "" {
					t.Errorf("OnPoll(%q, %v): want (\"\", EMFILE)", dir, err)
				}
				polls.Add(1)
			}}, emfile)
		}},
		{name: "watch refused (ENOSPC) on the journal dir", watcher: func(t *testing.T, polls *atomic.Int32) *Watcher {
			w := NewWatcher(WatcherOptions{PollInterval: 5 * time.Millisecond, OnPoll: func(dir string, err error) {
				if !errors.Is(err, unix.ENOSPC) {
					t.Errorf("OnPoll(%q, %v): want ENOSPC", dir, err)
				}
				polls.Add(1)
			}})
			n := 0
			w.addWatch = func(fd int, path string, mask uint32) (int, error) {
				if n++; n == 2 {
					return -1, unix.ENOSPC
				}
				return unix.InotifyAddWatch(fd, path, mask)
			}
			return w
		}},
		{name: "watch refused (EACCES) is the reader's error", wantErr: unix.EACCES, watcher: func(t *testing.T, polls *atomic.Int32) *Watcher {
			w := NewWatcher(WatcherOptions{OnPoll: func(string, error) { polls.Add(1) }})
			w.addWatch = func(int, string, uint32) (int, error) { return -1, unix.EACCES }
			return w
		}},
		{name: "own instance refused (EMFILE)", own: emfile},
		{name: "own instance refused (EINVAL) is the reader's error", own: func(int) (int, error) { return -1, unix.EINVAL }, wantErr: unix.EINVAL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var polls atomic.Int32
			var w *Watcher
			if tt.watcher != nil {
				w = tt.watcher(t, &polls)
				defer w.Close()
			}
			if tt.own != nil {
				inotifyInit = tt.own
				defer func() { inotifyInit = unix.InotifyInit1 }()
			}
			wr, r := followStdout(t, w)
			want := patternBytes(0, 0, 3000)
			wrote := make(chan struct{})
			defer func() { <-wrote }()
			go func() {
				defer close(wrote)
				for i := range 3 {
					time.Sleep(20 * time.Millisecond)
					wr.Write("stdout", want[i*1000:(i+1)*1000])
				}
				wr.Finish(Exit{Reason: ReasonExited})
			}()
			if tt.wantErr != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := followAll(ctx, r); !errors.Is(err, tt.wantErr) {
					t.Fatalf("read: got %v, want %v", err, tt.wantErr)
				}
				if polls.Load() != 0 {
					t.Errorf("OnPoll called %d times, want 0", polls.Load())
				}
				return
			}
			mustFollow(t, r, want)
			if r.poll == 0 {
				t.Error("reader does not poll")
			}
			if w != nil {
				if polls.Load() != 1 || w.Stats().Fallbacks != 1 {
					t.Errorf("OnPoll called %d times, Fallbacks %d; want 1, 1", polls.Load(), w.Stats().Fallbacks)
				}
				if st := w.Stats(); st.Watches != 0 {
					t.Errorf("watches after a refused subscription: got %d, want 0 (rolled back)", st.Watches)
				}
			}
		})
	}
}
