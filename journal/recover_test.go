package journal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRecoverContinues(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 16})
	w.Write("stdout", patternBytes(0, 0, 40))
	if _, err := Recover(dir); !errors.Is(err, ErrBusy) {
		t.Fatalf("Recover with live writer: got %v, want ErrBusy", err)
	}
	w.Close()
	w2, err := Recover(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if got := w2.Len("stdout"); got != 40 {
		t.Fatalf("Len after Recover: got %d, want 40", got)
	}
	w2.Write("stdout", patternBytes(0, 40, 30))
	if err := w2.Finish(Exit{Reason: ReasonExited}); err != nil {
		t.Fatal(err)
	}
	j := mustOpen(t, dir)
	if got := readRange(t, j, "stdout", 0); !bytes.Equal(got, patternBytes(0, 0, 70)) {
		t.Fatalf("after Recover and Finish: got %d bytes of wrong content", len(got))
	}
	if _, err := Recover(dir); !errors.Is(err, ErrFinished) {
		t.Fatalf("Recover after Finish: got %v, want ErrFinished", err)
	}
}

// A writer that died after committing the exit record to the index but
// before publishing exit.json: Recover publishes it.
func TestRecoverRepublishesExit(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}})
	w.Write("stdout", []byte("abc"))
	if err := w.Finish(Exit{Reason: ReasonExited, Code: 7}); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, exitName))
	if _, err := Recover(dir); !errors.Is(err, ErrFinished) {
		t.Fatalf("Recover: got %v, want ErrFinished", err)
	}
	e, ok, err := mustOpen(t, dir).Exit()
	if err != nil || !ok || e.Code != 7 || e.Lengths["stdout"] != 3 {
		t.Fatalf("Exit: got %+v, %v, %v", e, ok, err)
	}
}

// After a reboot only synced bytes are trusted: the stream is cut back to
// the index's committed length, dropping whole later segments.
func TestRecoverAfterReboot(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 10, SyncInterval: time.Hour})
	w.Write("stdout", patternBytes(0, 0, 25))
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	w.Write("stdout", patternBytes(0, 25, 20)) // not synced: segments 30 and 40 are new
	// Simulate the crash: leave the index as last committed.
	w.stopSyncer()
	w.db.Close()
	for _, s := range w.order {
		s.f.Close()
	}
	old := bootID
	bootID = func() string { return "another-boot" }
	defer func() { bootID = old }()
	w2, err := Recover(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if got := w2.Len("stdout"); got != 25 {
		t.Fatalf("Len after reboot: got %d, want 25 (the synced length)", got)
	}
	segs, _ := listSegments(filepath.Join(dir, "stdout"))
	if len(segs) != 3 || segs[2] != 20 {
		t.Fatalf("segments after reboot: got %v, want [0 10 20]", segs)
	}
	w2.Write("stdout", patternBytes(0, 25, 10))
	w2.Close()
	if got := readRange(t, mustOpen(t, dir), "stdout", 0); !bytes.Equal(got, patternBytes(0, 0, 35)) {
		t.Fatalf("after reboot recovery: wrong bytes")
	}
	checkIndexStreams(t, dir, "stdout")
}

func TestRecoverGapIsCorrupt(t *testing.T) {
	dir := t.TempDir()
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 10})
	w.Write("stdout", patternBytes(0, 0, 35))
	w.Close()
	os.Truncate(segPath(dir, "stdout", 10), 5)
	if _, err := Recover(dir); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Recover with a gap: got %v, want ErrCorrupt", err)
	}
}

func checkIndexStreams(t *testing.T, dir string, streams ...string) {
	t.Helper()
	old := crashStreams
	crashStreams = streams
	defer func() { crashStreams = old }()
	checkIndex(t, dir)
}

func TestOffsetAt(t *testing.T) {
	dir := t.TempDir()
	const iv = 20 * time.Millisecond
	w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, MarkInterval: iv, SyncInterval: 30 * time.Millisecond})
	// Each write is bracketed by the clock (stampedWrite); the bounds
	// below use the side of the bracket that makes them hold whatever the
	// gap.
	var writes []stampedWrite
	var off int64
	for i := 0; i < 60; i++ {
		writes = append(writes, writeStamped(w, &off, 10))
		time.Sleep(time.Duration(i%7) * time.Millisecond)
	}
	// firstFrom returns the offset of the first write whose bracket side
	// (chosen by at) is at or after t.
	firstFrom := func(t time.Time, at func(stampedWrite) time.Time) int64 {
		for _, x := range writes {
			if !at(x).Before(t) {
				return x.off
			}
		}
		return off
	}
	check := func(name string, lookup func(time.Time) (int64, error)) {
		t0, t1 := writes[0].before.Add(-time.Second), writes[len(writes)-1].after.Add(time.Second)
		for tt := t0; tt.Before(t1); tt = tt.Add(time.Millisecond) {
			got, err := lookup(tt)
			if err != nil {
				t.Fatalf("%s(%v): %v", name, tt, err)
			}
			// Never skips a byte written at/after t: a write that began
			// at or after t is included. Includes at most MarkInterval's
			// worth of earlier writes: nothing that ended before t-iv.
			hi := firstFrom(tt, func(x stampedWrite) time.Time { return x.before })
			lo := firstFrom(tt.Add(-iv), func(x stampedWrite) time.Time { return x.after })
			if got > hi || got < lo {
				t.Fatalf("%s(t): got %d, want within [%d, %d]", name, got, lo, hi)
			}
		}
	}
	check("Writer.OffsetAt", func(tt time.Time) (int64, error) { return w.OffsetAt("stdout", tt) })
	if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
		t.Fatal(err)
	}
	j := mustOpen(t, dir)
	check("Journal.OffsetAt", func(tt time.Time) (int64, error) { return j.OffsetAt("stdout", tt) })
}
