package journal

import (
	"testing"
	"time"
)

// stampedWrite is one write to a journal's stdout bracketed by the clock
// read just before and just after it: the writer reads its own clock
// somewhere in between, and under -race or on a busy machine that gap can
// be milliseconds, so a test bounds a mark's time by the side of the
// bracket that makes the bound hold whatever the gap.
type stampedWrite struct {
	before, after time.Time
	off           int64 // where the write began
}

// writeStamped writes n pattern bytes to stdout at *off, advances *off
// past what was written, and returns the write's bracket.
func writeStamped(w *Writer, off *int64, n int) stampedWrite {
	before := time.Now()
	k, _ := w.Write("stdout", patternBytes(0, *off, n))
	s := stampedWrite{before, time.Now(), *off}
	*off += int64(k)
	return s
}

// mustReader opens a Reader of stream from cursor (following the live
// writer when follow is set), failing t on an error; t's cleanup closes
// it.
func mustReader(t testing.TB, j *Journal, stream string, cursor int64, follow bool) *Reader {
	t.Helper()
	r, err := j.NewReader(stream, cursor, follow)
	if err != nil {
		t.Fatalf("NewReader(%s, %d): %v", stream, cursor, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
