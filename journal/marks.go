package journal

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// offsetAt answers "first offset written at or after t" from the committed
// marks (bucket, may be nil) and the uncommitted ones (pending, all newer).
//
// A mark (t_i, o_i) is taken at the first write at least interval after the
// previous mark, so every byte in [o_i, o_i+1) was written in
// [t_i, t_i+interval). Hence for t_i <= t < t_i+1: if t >= t_i+interval
// the answer o_i+1 is exact; otherwise it is o_i, which may include up to
// interval's worth of earlier bytes but never skips a byte written at or
// after t. The result is clamped to [start, end].
func offsetAt(marks *bolt.Bucket, pending []mark, interval time.Duration, t time.Time, start, end int64) int64 {
	tn := t.UnixNano()
	var prev, next *mark
	if marks != nil {
		c := marks.Cursor()
		k, v := c.Seek(u64(tn + 1)) // first mark after t
		if k != nil {
			next = &mark{getU64(k), getU64(v)}
			k, v = c.Prev()
		} else {
			k, v = c.Last()
		}
		if k != nil {
			prev = &mark{getU64(k), getU64(v)}
		}
	}
	for i := range pending {
		m := pending[i]
		if m.nanos <= tn {
			prev = &m
		} else {
			if next == nil {
				next = &m
			}
			break
		}
	}
	var off int64
	switch {
	case prev == nil:
		off = start
	case time.Duration(tn-prev.nanos) < interval:
		off = prev.off
	case next == nil:
		off = end
	default:
		off = next.off
	}
	return min(max(off, start), end)
}

// OffsetAt returns the first offset of stream written at or after t, within
// MarkInterval (it may return up to MarkInterval's worth of earlier bytes,
// never skip later ones). A t before the first retained byte gives the
// stream's start, a t after the last write its end.
func (w *Writer) OffsetAt(stream string, t time.Time) (int64, error) {
	s, err := w.stream(stream)
	if err != nil {
		return 0, err
	}
	// syncMu keeps a flush from holding marks that are neither pending nor
	// committed while we look.
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if w.state != nil {
		return 0, w.state
	}
	s.mu.Lock()
	pending := append([]mark(nil), s.marks...)
	start, end := s.segs[0], s.length
	s.mu.Unlock()
	var off int64
	err = w.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktStreams).Bucket([]byte(stream))
		off = offsetAt(b.Bucket(bktMarks), pending, w.opts.MarkInterval, t, start, end)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("offset at time: %w", err)
	}
	return off, nil
}

// Mark says when a byte of a stream was written: the write that began at
// Offset happened at Time (wall clock). Every byte from Offset up to the
// next mark's Offset was written at or after Time and before the next
// mark's Time, and within the journal's MarkInterval of Time: a mark is
// taken at the first write at least MarkInterval after the previous one.
type Mark struct {
	Offset int64
	Time   time.Time
}

// MaxMarks bounds one Marks answer.
const MaxMarks = 1000

// marksFrom lists, in offset order, the mark that covers byte from (the
// last at or before it) if any, then the later ones, at most limit (at
// most MaxMarks; 0 means MaxMarks). next is the offset of the first mark
// left off (the from of the next page, whose covering mark it is), or -1
// when none was.
func marksFrom(bucket *bolt.Bucket, pending []mark, from int64, limit int) (out []Mark, next int64) {
	if limit <= 0 || limit > MaxMarks {
		limit = MaxMarks
	}
	var all []mark
	if bucket != nil {
		c := bucket.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			all = append(all, mark{getU64(k), getU64(v)})
		}
	}
	all = append(all, pending...)
	first := 0
	for i, m := range all {
		if m.off <= from {
			first = i
		}
	}
	for _, m := range all[first:] {
		if len(out) == limit {
			return out, m.off
		}
		out = append(out, Mark{Offset: m.off, Time: time.Unix(0, m.nanos)})
	}
	return out, -1
}

// Marks returns stream's marks from the one covering byte from (see
// marksFrom), at most limit, the next page's from (-1: none) and the
// journal's MarkInterval.
func (w *Writer) Marks(stream string, from int64, limit int) ([]Mark, int64, time.Duration, error) {
	s, err := w.stream(stream)
	if err != nil {
		return nil, -1, 0, err
	}
	w.syncMu.Lock() // as in OffsetAt: no mark is between pending and committed
	defer w.syncMu.Unlock()
	if w.state != nil {
		return nil, -1, 0, w.state
	}
	s.mu.Lock()
	pending := append([]mark(nil), s.marks...)
	s.mu.Unlock()
	var out []Mark
	var next int64
	err = w.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bktStreams).Bucket([]byte(stream))
		out, next = marksFrom(b.Bucket(bktMarks), pending, from, limit)
		return nil
	})
	if err != nil {
		return nil, -1, 0, fmt.Errorf("read marks: %w", err)
	}
	return out, next, w.opts.MarkInterval, nil
}
