package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/agentrunner/runner/internal/atomicfile"
	bolt "go.etcd.io/bbolt"
)

func loadOptions(tx *bolt.Tx) (Options, error) {
	meta := tx.Bucket(bktMeta)
	if meta == nil || tx.Bucket(bktStreams) == nil {
		return Options{}, fmt.Errorf("%w: index has no meta", ErrCorrupt)
	}
	if v := getU64(meta.Get(keyVersion)); v != formatVersion {
		return Options{}, fmt.Errorf("%w: index format version %d", ErrCorrupt, v)
	}
	var so storedOptions
	if err := json.Unmarshal(meta.Get(keyOptions), &so); err != nil {
		return Options{}, fmt.Errorf("%w: index options: %w", ErrCorrupt, err)
	}
	return Options{Streams: so.Streams, SegmentBytes: so.SegmentBytes, RetainBytes: so.RetainBytes, SyncInterval: so.SyncInterval, MarkInterval: so.MarkInterval}.withDefaults()
}

// Recover reopens the journal in dir after its writer stopped without
// Finish (crashed, was killed, or called Close), and returns a Writer that
// continues appending; call Finish(Exit{Reason: "lost"}) on it to end the
// journal instead.
//
// Recover checks the index against the segment files and repairs it:
//
//   - After a writer crash on the same boot the page cache holds every
//     byte any write(2) put in, so the files are the truth: segments the
//     index misses are added, ones retention removed are dropped, the
//     length is the files' length (a write torn by the kill keeps the part
//     the kernel took, which readers may already have seen).
//
//   - After a reboot (power loss) only fsynced bytes are trustworthy: each
//     stream is cut back to the length the index committed, which the
//     writer only commits after fsyncing the segments, so a torn or
//     zero-filled tail is dropped.
//
//   - After a power loss before the first sync point of a journal made
//     with Options.DeferCreateSync, index.db may be empty or hold no
//     committed options: nothing of the journal was durable, so it is
//     recreated as a clean empty journal with the streams journal.json
//     (or the stream directories) name, and its segments are emptied.
//
// Segments that do not line up (a gap or an overlap) return ErrCorrupt.
// Recover returns an error matching fs.ErrNotExist if dir has no index.db
// (it never creates one), ErrBusy if a writer holds the journal and
// ErrFinished if it already has an exit record (re-publishing exit.json if
// a crash came between the index commit and the rename).
func Recover(dir string) (*Writer, error) {
	index := filepath.Join(dir, indexName)
	if _, err := os.Lstat(index); err != nil {
		return nil, fmt.Errorf("recover journal %s: %w", dir, err)
	}
	db, err := bolt.Open(index, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("recover journal %s: %w", dir, ErrBusy)
	}
	if err != nil {
		return nil, fmt.Errorf("recover journal %s: %w: %w", dir, ErrCorrupt, err)
	}
	// Both paths below start here: an exit record (in exit.json, or only
	// in the index, see recoverDB) means there is nothing to recover.
	if _, ok, err := readExit(dir); err != nil || ok {
		db.Close()
		if err == nil {
			err = ErrFinished
		}
		return nil, fmt.Errorf("recover journal %s: %w", dir, err)
	}
	if neverSynced(db) {
		w, err := recreate(dir, db)
		if err != nil {
			return nil, fmt.Errorf("recover journal %s: %w", dir, err)
		}
		return w, nil
	}
	w, err := recoverDB(dir, db)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("recover journal %s: %w", dir, err)
	}
	return w, nil
}

// neverSynced reports whether the index holds nothing Create committed:
// no meta bucket (bbolt's initial empty tree). On the same boot a visible
// index.db always has it (Create renames the index in only after its
// commit), so this is a power loss before the first sync point.
func neverSynced(db *bolt.DB) bool {
	empty := false
	db.View(func(tx *bolt.Tx) error {
		empty = tx.Bucket(bktMeta) == nil && tx.Bucket(bktStreams) == nil
		return nil
	})
	return empty
}

// recreate replaces a never-synced journal by a clean empty one with the
// same streams. It closes db.
func recreate(dir string, db *bolt.DB) (*Writer, error) {
	db.Close()
	// Open reads journal.json (segBytes stays 0 without it, which Create
	// takes as the default) or, failing that, the stream directories.
	j, err := Open(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: empty index and no streams", ErrCorrupt)
	}
	if err := os.Remove(filepath.Join(dir, indexName)); err != nil {
		return nil, err
	}
	return Create(dir, Options{Streams: j.streams, SegmentBytes: j.segBytes})
}

func recoverDB(dir string, db *bolt.DB) (*Writer, error) {
	var (
		opts     Options
		exit     []byte
		sameBoot bool
		synced   = map[string]int64{}
	)
	err := db.View(func(tx *bolt.Tx) error {
		var err error
		if opts, err = loadOptions(tx); err != nil {
			return err
		}
		meta := tx.Bucket(bktMeta)
		exit = append([]byte(nil), meta.Get(keyExit)...)
		id := bootID()
		sameBoot = id == "" || id == string(meta.Get(keyBootID))
		for _, name := range opts.Streams {
			b := tx.Bucket(bktStreams).Bucket([]byte(name))
			if b == nil {
				return fmt.Errorf("%w: index has no stream %q", ErrCorrupt, name)
			}
			synced[name] = getU64(b.Get(keyLength))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(exit) > 0 {
		// Finish committed the exit record but died before exit.json.
		if err := writeExit(dir, exit); err != nil {
			return nil, err
		}
		return nil, ErrFinished
	}

	if _, err := readMeta(dir); errors.Is(err, fs.ErrNotExist) {
		if err := writeMeta(dir, opts); err != nil {
			return nil, err
		}
	}
	w := &Writer{dir: dir, opts: opts, db: db, streams: map[string]*wstream{}}
	fail := func(err error) (*Writer, error) {
		for _, s := range w.order {
			s.f.Close()
		}
		return nil, err
	}
	for _, name := range opts.Streams {
		s, err := recoverStream(dir, name, synced[name], sameBoot)
		if err != nil {
			return fail(err)
		}
		w.streams[name] = s
		w.order = append(w.order, s)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		tx.Bucket(bktMeta).Put(keyBootID, []byte(bootID()))
		for _, s := range w.order {
			b := tx.Bucket(bktStreams).Bucket([]byte(s.name))
			start := s.segs[0]
			b.Put(keyLength, u64(s.length))
			b.Put(keyStart, u64(start))
			if err := b.DeleteBucket(bktSegs); err != nil {
				return err
			}
			segs, err := b.CreateBucket(bktSegs)
			if err != nil {
				return err
			}
			for _, off := range s.segs {
				segs.Put(u64(off), nil)
			}
			// Marks for bytes that no longer exist (cut after power loss).
			marks := b.Bucket(bktMarks)
			c := marks.Cursor()
			var doomed [][]byte
			for k, v := c.Last(); k != nil && getU64(v) > s.length; k, v = c.Prev() {
				doomed = append(doomed, k)
			}
			for _, k := range doomed {
				marks.Delete(k)
			}
			pruneMarks(marks, start)
		}
		return nil
	})
	if err != nil {
		return fail(fmt.Errorf("commit repaired index: %w", err))
	}
	w.start()
	return w, nil
}

// recoverStream makes the segment files of one stream consistent and opens
// the last one for appending.
func recoverStream(dir, name string, synced int64, sameBoot bool) (*wstream, error) {
	sdir := filepath.Join(dir, name)
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		return nil, err
	}
	segs, err := listSegments(sdir)
	if err != nil {
		return nil, err
	}
	sizes := make([]int64, len(segs))
	for i, off := range segs {
		st, err := os.Stat(segPath(dir, name, off))
		if err != nil {
			return nil, err
		}
		sizes[i] = st.Size()
	}
	if !sameBoot {
		// Cut to the synced length: drop whole segments beyond it, truncate
		// the one holding it.
		for len(segs) > 1 && segs[len(segs)-1] > synced {
			if err := os.Remove(segPath(dir, name, segs[len(segs)-1])); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			segs, sizes = segs[:len(segs)-1], sizes[:len(sizes)-1]
		}
		if len(segs) > 0 {
			i := len(segs) - 1
			if segs[i]+sizes[i] < synced {
				return nil, fmt.Errorf("%w: stream %s has %d bytes, index synced %d", ErrCorrupt, name, segs[i]+sizes[i], synced)
			}
			if segs[i] <= synced && segs[i]+sizes[i] > synced {
				if err := os.Truncate(segPath(dir, name, segs[i]), synced-segs[i]); err != nil {
					return nil, err
				}
				sizes[i] = synced - segs[i]
			}
		}
	}
	if len(segs) == 0 {
		if synced > 0 {
			return nil, fmt.Errorf("%w: stream %s has no segments, index synced %d bytes", ErrCorrupt, name, synced)
		}
		segs, sizes = []int64{0}, []int64{0}
	}
	for i := 1; i < len(segs); i++ {
		if segs[i-1]+sizes[i-1] != segs[i] {
			return nil, fmt.Errorf("%w: stream %s segment %d ends at %d, next starts at %d", ErrCorrupt, name, segs[i-1], segs[i-1]+sizes[i-1], segs[i])
		}
	}
	last := len(segs) - 1
	f, err := os.OpenFile(segPath(dir, name, segs[last]), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.SyncDir(sdir); err != nil {
		f.Close()
		return nil, err
	}
	return &wstream{
		name:   name,
		dir:    sdir,
		f:      f,
		base:   segs[last],
		length: segs[last] + sizes[last],
		segs:   segs,
		dirty:  true, // fsync what the crashed writer may not have
	}, nil
}
