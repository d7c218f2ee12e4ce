package journal

import (
	"errors"
	"os"
	"testing"
)

// TestComplete: Complete finds every way a stream's files can miss bytes
// of a range: a segment gone, one cut short, the end short of the range,
// and a start behind retention.
func TestComplete(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 10})
	w.Write("stdout", patternBytes(0, 0, 35)) // segments at 0, 10, 20 (10 bytes each) and 30 (5)
	if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
		t.Fatal(err)
	}
	j := mustOpen(t, dir)
	check := func(name string, from, to int64, want error) {
		t.Helper()
		if err := j.Complete("stdout", from, to); !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("%s: Complete(%d, %d) = %v, want %v", name, from, to, err, want)
		}
	}
	check("whole", 0, 35, nil)
	check("from the middle of a segment", 13, 35, nil)
	check("empty range", 35, 35, nil)
	check("past the end", 0, 36, ErrCorrupt)
	if err := os.Truncate(segPath(dir, "stdout", 20), 4); err != nil {
		t.Fatal(err)
	}
	check("a segment cut short", 0, 35, ErrCorrupt)
	check("before the cut", 0, 24, nil)
	if err := os.Remove(segPath(dir, "stdout", 10)); err != nil {
		t.Fatal(err)
	}
	check("a segment gone", 0, 35, ErrCorrupt)
	check("after the hole", 30, 35, nil)
	if err := os.Remove(segPath(dir, "stdout", 0)); err != nil {
		t.Fatal(err)
	}
	check("behind the first segment", 0, 35, ErrTruncated)
}
