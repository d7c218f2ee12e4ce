package journal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Journal is a read handle on a journal directory, usable from any process
// while a writer is alive or after it has gone. It never opens index.db
// while a writer lives. A Journal is safe for concurrent use; Readers made
// from it are independent and each must be closed by its owner. Close is
// idempotent.
type Journal struct {
	dir      string
	streams  []string
	segBytes int64 // from journal.json; 0 means unknown: list to find segments
	closed   atomic.Bool
}

// Open opens the journal in dir for reading.
func Open(dir string) (*Journal, error) {
	if _, err := os.Stat(filepath.Join(dir, indexName)); err != nil {
		return nil, fmt.Errorf("open journal %s: %w", dir, err)
	}
	j := &Journal{dir: dir}
	if m, err := readMeta(dir); err == nil {
		j.streams, j.segBytes = m.Streams, m.SegmentBytes
		return j, nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open journal %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.IsDir() && validStream(e.Name()) {
			j.streams = append(j.streams, e.Name())
		}
	}
	if len(j.streams) == 0 {
		return nil, fmt.Errorf("open journal %s: %w: no streams", dir, ErrCorrupt)
	}
	return j, nil
}

// Dir returns the journal directory.
func (j *Journal) Dir() string { return j.dir }

// Streams returns the journal's stream names, in Options order.
func (j *Journal) Streams() []string { return slices.Clone(j.streams) }

func (j *Journal) streamDir(stream string) (string, error) {
	if j.closed.Load() {
		return "", ErrClosed
	}
	if !slices.Contains(j.streams, stream) {
		return "", fmt.Errorf("%w: %q", ErrUnknownStream, stream)
	}
	return filepath.Join(j.dir, stream), nil
}

// Exit returns the exit record from exit.json; ok is false while the
// journal has none (the writer is running, or was lost).
func (j *Journal) Exit() (Exit, bool, error) {
	if j.closed.Load() {
		return Exit{}, false, ErrClosed
	}
	return readExit(j.dir)
}

// WriterAlive reports whether a writer currently holds the journal. It
// probes index.db with a non-blocking shared flock and never blocks the
// writer. A journal with no live writer and no exit record was lost (or
// closed for a later Recover).
func (j *Journal) WriterAlive() (bool, error) {
	if j.closed.Load() {
		return false, ErrClosed
	}
	return writerAlive(j.dir)
}

// Bounds returns the first retained offset and the current end of stream,
// from the segment files.
func (j *Journal) Bounds(stream string) (start, end int64, err error) {
	sdir, err := j.streamDir(stream)
	if err != nil {
		return 0, 0, err
	}
	start, end, _, err = bounds(sdir)
	return start, end, err
}

// bounds lists a stream directory: first retained offset, end, and the
// segments' first offsets.
func bounds(sdir string) (start, end int64, segs []int64, err error) {
	for range 8 {
		segs, err = listSegments(sdir)
		if err != nil {
			return 0, 0, nil, fmt.Errorf("list segments: %w", err)
		}
		if len(segs) == 0 {
			return 0, 0, nil, fmt.Errorf("list segments %s: %w: no segments", sdir, ErrCorrupt)
		}
		last := segs[len(segs)-1]
		st, err := os.Stat(filepath.Join(sdir, segName(last)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // only a Recover after power loss removes a last segment
		}
		if err != nil {
			return 0, 0, nil, fmt.Errorf("stat segment: %w", err)
		}
		return segs[0], last + st.Size(), segs, nil
	}
	return 0, 0, nil, fmt.Errorf("list segments %s: unstable directory", sdir)
}

// Complete reports whether stream's files hold every byte of [from, to):
// the segments from the one holding from on follow each other without a
// gap and the last reaches to. A journal that misses some (a segment lost
// or cut short by something other than its writer) is ErrCorrupt; from
// before the first retained offset is ErrTruncated. One stat per segment.
func (j *Journal) Complete(stream string, from, to int64) error {
	sdir, err := j.streamDir(stream)
	if err != nil {
		return err
	}
	segs, err := listSegments(sdir)
	if err != nil {
		return fmt.Errorf("list segments: %w", err)
	}
	if from >= to {
		return nil
	}
	if len(segs) == 0 {
		return fmt.Errorf("%s: %w: no segments", stream, ErrCorrupt)
	}
	if from < segs[0] {
		return fmt.Errorf("%s at %d: %w", stream, from, ErrTruncated)
	}
	pos := from
	for _, off := range segs {
		if pos >= to {
			return nil
		}
		if off > pos {
			return fmt.Errorf("%s: %w: no bytes from %d to %d", stream, ErrCorrupt, pos, off)
		}
		st, err := os.Stat(filepath.Join(sdir, segName(off)))
		if err != nil {
			return fmt.Errorf("stat segment: %w", err)
		}
		pos = max(pos, off+st.Size())
	}
	if pos < to {
		return fmt.Errorf("%s: %w: ends at %d, want %d", stream, ErrCorrupt, pos, to)
	}
	return nil
}

// OffsetAt returns the first offset of stream written at or after t (within
// MarkInterval, never skipping a later byte), from the index. It returns
// ErrBusy while a writer lives: ask the writer (Writer.OffsetAt) instead.
func (j *Journal) OffsetAt(stream string, t time.Time) (int64, error) {
	sdir, err := j.streamDir(stream)
	if err != nil {
		return 0, err
	}
	alive, err := writerAlive(j.dir)
	if err != nil {
		return 0, err
	}
	if alive {
		return 0, ErrBusy
	}
	start, end, _, err := bounds(sdir)
	if err != nil {
		return 0, err
	}
	db, err := bolt.Open(filepath.Join(j.dir, indexName), 0o600, &bolt.Options{ReadOnly: true, Timeout: 200 * time.Millisecond})
	if errors.Is(err, bolt.ErrTimeout) {
		return 0, ErrBusy
	}
	if err != nil {
		return 0, fmt.Errorf("open journal index: %w", err)
	}
	defer db.Close()
	var off int64
	err = db.View(func(tx *bolt.Tx) error {
		o, err := loadOptions(tx)
		if err != nil {
			return err
		}
		var marks *bolt.Bucket
		if b := tx.Bucket(bktStreams).Bucket([]byte(stream)); b != nil {
			marks = b.Bucket(bktMarks)
		}
		off = offsetAt(marks, nil, o.MarkInterval, t, start, end)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("offset at time: %w", err)
	}
	return off, nil
}

// Marks returns stream's marks from the one covering byte from, at most
// limit (see Writer.Marks), and the journal's MarkInterval, from the index.
// It returns ErrBusy while a writer lives: ask the writer instead.
func (j *Journal) Marks(stream string, from int64, limit int) ([]Mark, int64, time.Duration, error) {
	if _, err := j.streamDir(stream); err != nil {
		return nil, -1, 0, err
	}
	alive, err := writerAlive(j.dir)
	if err != nil {
		return nil, -1, 0, err
	}
	if alive {
		return nil, -1, 0, ErrBusy
	}
	db, err := bolt.Open(filepath.Join(j.dir, indexName), 0o600, &bolt.Options{ReadOnly: true, Timeout: 200 * time.Millisecond})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, -1, 0, ErrBusy
	}
	if err != nil {
		return nil, -1, 0, fmt.Errorf("open journal index: %w", err)
	}
	defer db.Close()
	var out []Mark
	var next int64
	var interval time.Duration
	err = db.View(func(tx *bolt.Tx) error {
		o, err := loadOptions(tx)
		if err != nil {
			return err
		}
		interval = o.MarkInterval
		var marks *bolt.Bucket
		if b := tx.Bucket(bktStreams).Bucket([]byte(stream)); b != nil {
			marks = b.Bucket(bktMarks)
		}
		out, next = marksFrom(marks, nil, from, limit)
		return nil
	})
	if err != nil {
		return nil, -1, 0, fmt.Errorf("read marks: %w", err)
	}
	return out, next, interval, nil
}

// Close releases the handle. It is idempotent.
func (j *Journal) Close() error {
	j.closed.Store(true)
	return nil
}

// segmentFor returns the first offset of the segment holding cursor.
func segmentFor(segs []int64, cursor int64) int64 {
	i := sort.Search(len(segs), func(i int) bool { return segs[i] > cursor })
	return segs[i-1] // callers ensure segs[0] <= cursor
}
