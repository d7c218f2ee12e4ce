package journal

import (
	"errors"
	"testing"
	"time"
)

// TestMarks: a mark per write at least MarkInterval after the previous
// one, at that write's offset, with a time inside the write's bracket;
// from starts at the covering mark; pages of limit chain through next
// with no mark twice and none missed; the same answers from the live
// writer (pending and committed marks) and from the index after Finish.
func TestMarks(t *testing.T) {
	dir := t.TempDir()
	const iv = 15 * time.Millisecond
	w := mustCreate(t, dir, Options{Streams: []string{"stdout", "stderr"}, MarkInterval: iv, SyncInterval: 10 * time.Millisecond})
	var writes []stampedWrite
	var off int64
	for i := 0; i < 8; i++ {
		writes = append(writes, writeStamped(w, &off, 10))
		// A second write at once joins the mark of the first.
		n, _ := w.Write("stdout", patternBytes(0, off, 5))
		off += int64(n)
		time.Sleep(iv + 5*time.Millisecond)
	}
	check := func(name string, marks func(stream string, from int64, limit int) ([]Mark, int64, time.Duration, error)) {
		t.Helper()
		all, next, gotIv, err := marks("stdout", 0, 0)
		if err != nil || next != -1 || gotIv != iv {
			t.Fatalf("%s: next %d interval %v err %v, want -1, %v, nil", name, next, gotIv, err, iv)
		}
		if len(all) != len(writes) {
			t.Fatalf("%s: got %d marks %+v, want %d", name, len(all), all, len(writes))
		}
		for i, m := range all {
			if m.Offset != writes[i].off || m.Time.Before(writes[i].before) || m.Time.After(writes[i].after) {
				t.Errorf("%s: mark %d = %d at %v, want %d within [%v, %v]", name, i, m.Offset, m.Time, writes[i].off, writes[i].before, writes[i].after)
			}
		}
		// from 17 is inside the second mark's bytes [15, 30).
		if got, _, _, _ := marks("stdout", 17, 0); len(got) != len(all)-1 || got[0] != all[1] {
			t.Errorf("%s: from 17: got %+v, want from the mark at 15", name, got)
		}
		var paged []Mark
		for from := int64(0); ; {
			page, next, _, err := marks("stdout", from, 3)
			if err != nil || len(page) > 3 {
				t.Fatalf("%s: page from %d: %d marks, %v", name, from, len(page), err)
			}
			paged = append(paged, page...)
			if next < 0 {
				break
			}
			from = next
		}
		if len(paged) != len(all) {
			t.Fatalf("%s: pages of 3 gave %d marks, want %d", name, len(paged), len(all))
		}
		for i := range all {
			if paged[i] != all[i] {
				t.Errorf("%s: paged mark %d = %+v, want %+v", name, i, paged[i], all[i])
			}
		}
		if got, next, _, err := marks("stderr", 0, 0); err != nil || len(got) != 0 || next != -1 {
			t.Errorf("%s: stderr, never written: got %+v next %d err %v, want none", name, got, next, err)
		}
		if _, _, _, err := marks("stdin", 0, 0); !errors.Is(err, ErrUnknownStream) {
			t.Errorf("%s: stdin: got %v, want ErrUnknownStream", name, err)
		}
	}
	check("Writer.Marks", w.Marks)
	j := mustOpen(t, dir)
	if _, _, _, err := j.Marks("stdout", 0, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("Journal.Marks with a live writer: got %v, want ErrBusy", err)
	}
	if err := w.Finish(Exit{Reason: ReasonExited}); err != nil {
		t.Fatal(err)
	}
	check("Journal.Marks", j.Marks)
}
