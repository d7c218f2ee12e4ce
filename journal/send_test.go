package journal

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fileForm records whether every ReadFrom it got carried the form sendfile
// needs (an *io.LimitedReader over an *os.File), then copies like w.
type fileForm struct {
	w     io.Writer
	calls int
	other int // ReadFrom calls with any other reader
}

func (f *fileForm) Write(p []byte) (int, error) { return f.w.Write(p) }

func (f *fileForm) ReadFrom(r io.Reader) (int64, error) {
	f.calls++
	if lr, ok := r.(*io.LimitedReader); !ok {
		f.other++
	} else if _, ok := lr.R.(*os.File); !ok {
		f.other++
	}
	if rf, ok := f.w.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{f.w}, r)
}

// finishedJournal writes size pattern bytes to stdout in segments of seg
// bytes and finishes the journal.
func finishedJournal(t *testing.T, size int, seg int64) (*Journal, []byte) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "j")
	w := mustCreate(t, dir, Options{Streams: []string{"stdout", "stderr"}, SegmentBytes: seg})
	want := patternBytes(0, 0, size)
	for off := 0; off < size; off += 777 {
		if _, err := w.Write("stdout", want[off:min(off+777, size)]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(Exit{Reason: ReasonExited, Code: 1}); err != nil {
		t.Fatal(err)
	}
	return mustOpen(t, dir), want
}

func TestSendToFinished(t *testing.T) {
	j, want := finishedJournal(t, 10_000, 1000)
	size := int64(len(want))
	for _, tc := range []struct {
		name   string
		cursor int64
		n      int64
		err    error // nil: n bytes
	}{
		{"all", 0, size, nil},
		{"from a boundary", 3000, size - 3000, nil},
		{"inside a segment", 1234, size - 1234, nil},
		{"to a boundary", 10, 4990, nil},
		{"nothing", 500, 0, nil},
		{"at the end", size, 0, nil},
		{"past the end", 9000, 1001, io.ErrUnexpectedEOF},
		{"from the end", size, 1, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustReader(t, j, "stdout", tc.cursor, false)
			var buf bytes.Buffer
			got, err := r.SendTo(context.Background(), &buf, tc.n)
			wantN := min(tc.n, size-tc.cursor)
			if !errors.Is(err, tc.err) || got != wantN {
				t.Fatalf("SendTo(%d) from %d: got %d, %v; want %d, %v", tc.n, tc.cursor, got, err, wantN, tc.err)
			}
			if !bytes.Equal(buf.Bytes(), want[tc.cursor:tc.cursor+wantN]) {
				t.Fatalf("SendTo from %d: %d bytes, content differs from the stream", tc.cursor, buf.Len())
			}
			if r.Offset() != tc.cursor+wantN {
				t.Fatalf("Offset after SendTo: got %d, want %d", r.Offset(), tc.cursor+wantN)
			}
			// Read continues exactly where SendTo stopped.
			rest, err := io.ReadAll(r)
			if err != nil || !bytes.Equal(rest, want[tc.cursor+wantN:]) {
				t.Fatalf("Read after SendTo: got %d bytes, %v; want the %d after", len(rest), err, size-tc.cursor-wantN)
			}
		})
	}
}

// TestSendToTCPFileForm sends over real loopback TCP and checks that every
// copy reached the connection as a file range, the form net.TCPConn
// copies with sendfile(2).
func TestSendToTCPFileForm(t *testing.T) {
	j, want := finishedJournal(t, 200_000, 64<<10)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := mustReader(t, j, "stdout", 5, false)
	dst := &fileForm{w: c}
	n, err := r.SendTo(context.Background(), dst, int64(len(want))-5)
	c.Close()
	if err != nil || n != int64(len(want))-5 {
		t.Fatalf("SendTo: got %d, %v; want %d, nil", n, err, len(want)-5)
	}
	if b := <-got; !bytes.Equal(b, want[5:]) {
		t.Fatalf("received %d bytes, want %d (or content differs)", len(b), len(want)-5)
	}
	// 200,000 bytes from offset 5 in 64 KiB segments: four segments.
	if dst.calls != 4 || dst.other != 0 {
		t.Fatalf("ReadFrom calls: got %d (%d not a file range), want 4 file ranges", dst.calls, dst.other)
	}
}

// TestSendToFollow checks a follow Reader waits for bytes, ends at the
// final length (never past it), and reports a lost writer.
func TestSendToFollow(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 100})
	j := mustOpen(t, dir)
	w.Write("stdout", patternBytes(0, 0, 150))
	r := mustReader(t, j, "stdout", 0, true)
	type result struct {
		n   int64
		err error
	}
	var buf bytes.Buffer
	done := make(chan result, 1)
	go func() {
		n, err := r.SendTo(context.Background(), &buf, 1000)
		done <- result{n, err}
	}()
	time.Sleep(20 * time.Millisecond) // let it send what is there and wait
	w.Write("stdout", patternBytes(0, 150, 100))
	if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.n != 250 || !errors.Is(res.err, io.ErrUnexpectedEOF) {
			t.Fatalf("SendTo past the final length: got %d, %v; want 250, io.ErrUnexpectedEOF", res.n, res.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SendTo did not end after Finish")
	}
	if !bytes.Equal(buf.Bytes(), patternBytes(0, 0, 250)) {
		t.Fatalf("follow SendTo: %d bytes, content differs", buf.Len())
	}

	// A writer gone without an exit record: ErrLost once every byte is out.
	dir = t.TempDir()
	w = mustCreate(t, dir, Options{Streams: []string{"stdout"}})
	w.Write("stdout", []byte("hello"))
	w.Close()
	r2, err := mustOpen(t, dir).NewReader("stdout", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	buf.Reset()
	if n, err := r2.SendTo(context.Background(), &buf, 10); n != 5 || !errors.Is(err, ErrLost) || buf.String() != "hello" {
		t.Fatalf("SendTo after a lost writer: got %d %q, %v; want 5 \"hello\", ErrLost", n, buf.String(), err)
	}
	// And ctx ends a wait.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	dir = t.TempDir()
	w = mustCreate(t, dir, Options{Streams: []string{"stdout"}})
	r3, err := mustOpen(t, dir).NewReader("stdout", 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r3.Close()
	if n, err := r3.SendTo(ctx, io.Discard, 1); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SendTo waiting past ctx: got %d, %v; want 0, DeadlineExceeded", n, err)
	}
}

// TestSendToLive checks a non-follow Reader on a live journal sends what
// is on disk and stops there, and one that fell behind retention gets
// ErrTruncated, as Read does.
func TestSendToLive(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 10, RetainBytes: 20})
	w.Write("stdout", patternBytes(0, 0, 15))
	j := mustOpen(t, dir)
	r := mustReader(t, j, "stdout", 0, false)
	var buf bytes.Buffer
	if n, err := r.SendTo(context.Background(), &buf, 5); n != 5 || err != nil {
		t.Fatalf("SendTo: got %d, %v; want 5, nil", n, err)
	}
	if n, err := r.SendTo(context.Background(), &buf, 100); n != 10 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("SendTo past the live end: got %d, %v; want 10, io.ErrUnexpectedEOF", n, err)
	}
	if !bytes.Equal(buf.Bytes(), patternBytes(0, 0, 15)) {
		t.Fatal("live SendTo: content differs")
	}

	r2, err := j.NewReader("stdout", 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	buf.Reset()
	if n, err := r2.SendTo(context.Background(), &buf, 5); n != 5 || err != nil {
		t.Fatalf("SendTo: got %d, %v", n, err)
	}
	// The reader's segment and its successor are removed.
	w.Write("stdout", patternBytes(0, 15, 40))
	n, err := r2.SendTo(context.Background(), &buf, 100)
	if n != 5 || !errors.Is(err, ErrTruncated) {
		t.Fatalf("SendTo past removed segments: got %d, %v; want 5 (the rest of its open segment), ErrTruncated", n, err)
	}
	if !bytes.Equal(buf.Bytes(), patternBytes(0, 0, 10)) {
		t.Fatal("SendTo under retention: content differs")
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.SendTo(context.Background(), &buf, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("SendTo after Close: got %v, want ErrClosed", err)
	}
}
