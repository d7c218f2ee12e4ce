package journal

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pattern returns the byte a test writer puts at offset off of stream
// number s: position-dependent, so a lost or duplicated chunk shows.
func pattern(s int, off int64) byte {
	return byte(off*131 + off>>9*7 + off>>17 + int64(s)*97)
}

func patternBytes(s int, off int64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = pattern(s, off+int64(i))
	}
	return b
}

func mustCreate(t testing.TB, dir string, opts Options) *Writer {
	t.Helper()
	w, err := Create(dir, opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func mustOpen(t testing.TB, dir string) *Journal {
	t.Helper()
	j, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

// readRange reads stream from cursor until io.EOF (non-follow).
func readRange(t testing.TB, j *Journal, stream string, cursor int64) []byte {
	t.Helper()
	r, err := j.NewReader(stream, cursor, false)
	if err != nil {
		t.Fatalf("NewReader(%s, %d): %v", stream, cursor, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read %s from %d: %v", stream, cursor, err)
	}
	return b
}

func TestWriteReadSegments(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "j")
	w := mustCreate(t, dir, Options{Streams: []string{"stdout", "stderr"}, SegmentBytes: 100})
	var want [2][]byte
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		s := i % 2
		name := []string{"stdout", "stderr"}[s]
		p := patternBytes(s, int64(len(want[s])), rng.IntN(250))
		n, err := w.Write(name, p)
		if err != nil || n != len(p) {
			t.Fatalf("Write: got %d, %v; want %d, nil", n, err, len(p))
		}
		want[s] = append(want[s], p...)
	}
	j := mustOpen(t, dir)
	if got := j.Streams(); len(got) != 2 || got[0] != "stdout" || got[1] != "stderr" {
		t.Fatalf("Streams: got %v", got)
	}
	for s, name := range []string{"stdout", "stderr"} {
		if got := w.Len(name); got != int64(len(want[s])) {
			t.Fatalf("Len(%s): got %d, want %d", name, got, len(want[s]))
		}
		start, end, err := j.Bounds(name)
		if err != nil || start != 0 || end != int64(len(want[s])) {
			t.Fatalf("Bounds(%s): got %d, %d, %v; want 0, %d", name, start, end, err, len(want[s]))
		}
		for _, c := range []int64{0, 1, 99, 100, 101, int64(len(want[s])) / 2, int64(len(want[s]))} {
			if got := readRange(t, j, name, c); !bytes.Equal(got, want[s][c:]) {
				t.Fatalf("read %s from %d: got %d bytes, want %d (or content differs)", name, c, len(got), len(want[s])-int(c))
			}
		}
		// cat of the segments is the stream.
		segs, _ := listSegments(filepath.Join(dir, name))
		var cat []byte
		for _, off := range segs {
			b, _ := os.ReadFile(segPath(dir, name, off))
			cat = append(cat, b...)
			if len(b) > 100 {
				t.Fatalf("segment %d has %d bytes, over SegmentBytes", off, len(b))
			}
		}
		if !bytes.Equal(cat, want[s]) {
			t.Fatalf("cat segments of %s differs from stream", name)
		}
	}
	if err := w.Finish(Exit{Reason: ReasonExited, Code: 3}); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	// Without journal.json readers find segments by listing.
	os.Remove(filepath.Join(dir, metaName))
	j2 := mustOpen(t, dir)
	if j2.segBytes != 0 {
		t.Fatalf("segBytes without journal.json: got %d, want 0", j2.segBytes)
	}
	for s, name := range []string{"stdout", "stderr"} {
		for _, c := range []int64{0, 100, 150, int64(len(want[s]))} {
			if got := readRange(t, j2, name, c); !bytes.Equal(got, want[s][c:]) {
				t.Fatalf("listing path: read %s from %d: wrong bytes", name, c)
			}
		}
		if _, err := j2.NewReader(name, int64(len(want[s]))+1, false); !errors.Is(err, ErrInvalidCursor) {
			t.Fatalf("listing path: cursor past end: got %v", err)
		}
	}
	e, ok, err := j.Exit()
	if err != nil || !ok {
		t.Fatalf("Exit: got %v, %v", ok, err)
	}
	if e.Code != 3 || e.Reason != ReasonExited || e.Lengths["stdout"] != int64(len(want[0])) || e.Lengths["stderr"] != int64(len(want[1])) {
		t.Fatalf("Exit: got %+v", e)
	}
	if _, err := w.Write("stdout", []byte("x")); !errors.Is(err, ErrFinished) {
		t.Fatalf("Write after Finish: got %v, want ErrFinished", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close after Finish: %v", err)
	}
}

func TestCreateExists(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}})
	if _, err := Create(dir, Options{Streams: []string{"stdout"}}); !errors.Is(err, ErrExists) {
		t.Fatalf("second Create: got %v, want ErrExists", err)
	}
	w.Close()
	if _, err := Create(dir, Options{Streams: []string{"stdout"}}); !errors.Is(err, ErrExists) {
		t.Fatalf("Create after Close: got %v, want ErrExists", err)
	}
}

func TestBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"no streams", Options{}},
		{"bad name", Options{Streams: []string{"../x"}}},
		{"upper", Options{Streams: []string{"Stdout"}}},
		{"too long", Options{Streams: []string{"abcdefghijabcdefghijabcdefghijabc"}}},
		{"dup", Options{Streams: []string{"a", "a"}}},
		{"negative", Options{Streams: []string{"a"}, SegmentBytes: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if w, err := Create(t.TempDir(), tc.opts); err == nil {
				w.Close()
				t.Fatalf("Create(%+v): got nil error", tc.opts)
			}
		})
	}
}

func TestCursorErrors(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 10, RetainBytes: 25})
	w.Write("stdout", patternBytes(0, 0, 100))
	j := mustOpen(t, dir)
	start, end, err := j.Bounds("stdout")
	if err != nil {
		t.Fatal(err)
	}
	// Retention: at most RetainBytes+SegmentBytes retained, whole segments.
	if end != 100 || start%10 != 0 || end-start > 35 || end-start < 25 {
		t.Fatalf("Bounds: got [%d, %d], want end 100 and 25..35 bytes retained on a segment boundary", start, end)
	}
	for _, tc := range []struct {
		cursor int64
		want   error
	}{
		{-1, ErrInvalidCursor},
		{end + 1, ErrInvalidCursor},
		{start - 1, ErrTruncated},
		{0, ErrTruncated},
	} {
		_, err := j.NewReader("stdout", tc.cursor, false)
		var ce *CursorError
		if !errors.Is(err, tc.want) || !errors.As(err, &ce) || ce.Start != start || ce.End != end || ce.Cursor != tc.cursor {
			t.Errorf("NewReader(%d): got %v, want %v in a CursorError{Start %d End %d}", tc.cursor, err, tc.want, start, end)
		}
	}
	if got := readRange(t, j, "stdout", start); !bytes.Equal(got, patternBytes(0, start, int(end-start))) {
		t.Fatalf("read retained: wrong bytes")
	}
	if _, err := j.NewReader("nope", 0, false); !errors.Is(err, ErrUnknownStream) {
		t.Fatalf("unknown stream: got %v", err)
	}
}

func TestRetentionUnderReader(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 10, RetainBytes: 20})
	w.Write("stdout", patternBytes(0, 0, 15))
	j := mustOpen(t, dir)
	r := mustReader(t, j, "stdout", 0, true)
	buf := make([]byte, 5)
	if n, err := r.Read(buf); n != 5 || err != nil {
		t.Fatalf("Read: got %d, %v", n, err)
	}
	// The reader's segment and its successor are removed.
	w.Write("stdout", patternBytes(0, 15, 40))
	// It still has its open segment: the rest of it is exact.
	got, err := io.ReadFull(r, make([]byte, 5))
	if got != 5 || err != nil {
		t.Fatalf("read rest of removed segment: got %d, %v", got, err)
	}
	_, err = r.Read(buf)
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("read past removed segments: got %v, want ErrTruncated", err)
	}
}

func TestFollowAndFinish(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout", "stderr"}, SegmentBytes: 64})
	j := mustOpen(t, dir)
	type result struct {
		name string
		b    []byte
		err  error
	}
	results := make(chan result, 2)
	for _, name := range []string{"stdout", "stderr"} {
		r := mustReader(t, j, name, 0, true)
		go func() {
			b, err := io.ReadAll(r)
			results <- result{name, b, err}
		}()
	}
	var want []byte
	for i := 0; i < 50; i++ {
		p := patternBytes(0, int64(len(want)), i*3)
		w.Write("stdout", p)
		want = append(want, p...)
		if i%10 == 0 {
			time.Sleep(2 * time.Millisecond) // let the reader catch up and wait
		}
	}
	if err := w.Finish(Exit{Reason: ReasonSignaled, Signal: 9}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case res := <-results:
			if res.err != nil {
				t.Fatalf("follow: %v", res.err)
			}
			w := want
			if res.name == "stderr" {
				w = nil
			}
			if !bytes.Equal(res.b, w) {
				t.Fatalf("follow %s: got %d bytes, want %d", res.name, len(res.b), len(w))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("follow reader did not end after Finish")
		}
	}
}

func TestFollowLostAndContext(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}})
	w.Write("stdout", []byte("hello"))
	j := mustOpen(t, dir)
	if alive, err := j.WriterAlive(); !alive || err != nil {
		t.Fatalf("WriterAlive: got %v, %v; want true", alive, err)
	}
	if _, err := j.OffsetAt("stdout", time.Now()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Journal.OffsetAt with live writer: got %v, want ErrBusy", err)
	}
	r := mustReader(t, j, "stdout", 0, true)
	buf := make([]byte, 64)
	if n, err := r.Read(buf); n != 5 || err != nil {
		t.Fatalf("Read: got %d, %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := r.ReadContext(ctx, buf); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadContext at end: got %v, want DeadlineExceeded", err)
	}
	done := make(chan error, 1)
	go func() {
		n, err := r.Read(buf)
		if n != 3 || err != nil {
			done <- err
			return
		}
		_, err = r.Read(buf)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	w.Write("stdout", []byte("bye"))
	w.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLost) {
			t.Fatalf("follow after Close: got %v, want ErrLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow reader did not notice the writer leaving")
	}
	if alive, err := j.WriterAlive(); alive || err != nil {
		t.Fatalf("WriterAlive after Close: got %v, %v; want false", alive, err)
	}
}
