package sessions

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/journal"
)

// TestStreamLengthMatchesJournal: the listing's length of a stream, read
// from segment file metadata alone, equals the journal's own Bounds end,
// across segment rolls and with retention having removed the oldest
// segments; a stream directory without segments is an error, not 0.
func TestStreamLengthMatchesJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "journal")
	w, err := journal.Create(dir, journal.Options{Streams: []string{"stdout", "stderr"}, SegmentBytes: 4096, RetainBytes: 3 * 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	j, err := journal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	buf := make([]byte, 512) // small: several directory reads per stream
	for _, n := range []int{0, 1, 4095, 1, 4096, 10000, 30000, 7} {
		if _, err := w.Write("stdout", bytes.Repeat([]byte("x"), n)); err != nil {
			t.Fatal(err)
		}
		for _, stream := range []string{"stdout", "stderr"} {
			_, want, err := j.Bounds(stream)
			if err != nil {
				t.Fatal(err)
			}
			got, err := streamLength(filepath.Join(dir, stream), buf)
			if err != nil || got != want {
				t.Fatalf("after a write of %d: %s length %d (%v), want %d", n, stream, got, err, want)
			}
		}
	}
	if _, err := streamLength(t.TempDir(), buf); err == nil {
		t.Error("a directory without segments: got a length, want an error")
	}
}
