package checkpoint

// The Store: its on-disk types, Open, the index, listing and disk usage,
// Delete and the chunk garbage collector. Create is in create.go, Restore
// in restore.go.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/klauspost/compress/zstd"
	"github.com/restic/chunker"
	"golang.org/x/sys/unix"
)

var (
	// ErrUnknown is returned when a checkpoint id names no checkpoint of
	// the store (malformed ids included).
	ErrUnknown = errors.New("no such checkpoint")
	// ErrCorrupt is returned by Restore when a stored chunk is missing or
	// its bytes do not hash to its name (nothing was swapped), and by
	// Import for an archive that is damaged, truncated, of another
	// version, over a limit or hostile (nothing was kept).
	ErrCorrupt = errors.New("checkpoint corrupted")
	// ErrInvalid is returned for arguments that cannot be honoured (a
	// different number of directories than the checkpoint holds).
	ErrInvalid = errors.New("invalid checkpoint request")
)

// pol is the chunker's irreducible polynomial. restic draws one per
// repository to hide chunk boundaries from an attacker who can read the
// repository; here the store is private to runnerd, and a fixed one keeps
// boundaries stable across a sandbox's checkpoints without storing it.
const pol = chunker.Pol(0x3DA3358B4DC173)

// Info describes one checkpoint.
type Info struct {
	ID      string    `json:"id"`
	Comment string    `json:"comment,omitempty"`
	Created time.Time `json:"created"`
	// Size is the bytes of the regular files captured.
	Size int64 `json:"size"`
	// Stored is what this checkpoint added to the store when it was made:
	// compressed bytes of chunks no earlier checkpoint had, plus its
	// snapshot file.
	Stored int64 `json:"stored"`
	Files  int   `json:"files"`
	// Skipped counts sockets, fifos and devices, which are not captured.
	Skipped int `json:"skipped,omitempty"`
	// Frozen is how long the freeze (Options.Freeze) was held.
	Frozen time.Duration `json:"frozen_ns"`
}

type entry struct {
	Path   string      `json:"p"`
	Mode   fs.FileMode `json:"m"`
	UID    int         `json:"u"`
	GID    int         `json:"g"`
	Mtime  int64       `json:"t"`
	Target string      `json:"l,omitempty"`
	Size   int64       `json:"s,omitempty"`
	Chunks []string    `json:"c,omitempty"`
	Ino    uint64      `json:"i,omitempty"` // with Ctime: reuse the chunks of an unchanged file
	Ctime  int64       `json:"ct,omitempty"`
}

type snapshot struct {
	Info  Info      `json:"info"`
	Trees [][]entry `json:"trees"`
}

type index struct {
	Checkpoints []Info `json:"checkpoints"`
}

// Store is one sandbox's checkpoints. Its methods are safe for concurrent
// use (they serialize on the store's mutex); two Stores over one
// directory are not.
type Store struct {
	dir string
	mu  sync.Mutex // serializes every operation on dir
	enc *zstd.Encoder
	dec *zstd.Decoder
}

// Open opens (creating) the store at dir and recovers it from a crash: it
// finishes or rolls back a recorded restore swap, and after an
// interrupted checkpoint removes its snapshot and chunks. The caller must
// be the store's only user while Open runs (runnerd holds the sandbox's
// lock): recovery would take an attempt in progress for a crashed one.
func Open(dir string) (*Store, error) {
	s, err := OpenForReading(dir)
	if err != nil {
		return nil, err
	}
	if err := s.recoverRestore(); err != nil {
		s.Close()
		return nil, err
	}
	if _, err := os.Stat(s.path("dirty")); err == nil {
		if err := s.gc(); err != nil {
			s.Close()
			return nil, err
		}
		if err := os.Remove(s.path("dirty")); err != nil {
			s.Close()
			return nil, fmt.Errorf("open checkpoint store: %w", err)
		}
	}
	return s, nil
}

// OpenForReading opens the store at dir without recovering it, for List
// and Get alongside a checkpoint, delete or restore in progress (they see
// the index as it was before or after, never a part).
func OpenForReading(dir string) (*Store, error) {
	for _, d := range []string{dir, filepath.Join(dir, "snapshots"), filepath.Join(dir, "chunks")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("open checkpoint store: %w", err)
		}
	}
	// SpeedFastest is zstd level 1's counterpart, the figure's baseline.
	// EncodeAll and DecodeAll are safe for concurrent use, at most the
	// codec's concurrency at once: one per core, for the capture's hashers
	// and the restore's and import's workers.
	n := max(parallel(), 1)
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(n))
	if err != nil {
		return nil, fmt.Errorf("open checkpoint store: %w", err)
	}
	// A chunk decodes to at most chunker.MaxSize bytes: DecodeAll into a
	// buffer of that capacity stops there (an imported frame that claims
	// more is refused, never allocated).
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(n), zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(chunker.MaxSize), zstd.WithDecoderMaxWindow(maxWindow))
	if err != nil {
		enc.Close()
		return nil, fmt.Errorf("open checkpoint store: %w", err)
	}
	return &Store{dir: dir, enc: enc, dec: dec}, nil
}

// Close releases the store's codecs.
func (s *Store) Close() error {
	s.dec.Close()
	return s.enc.Close()
}

func (s *Store) path(elems ...string) string {
	return filepath.Join(append([]string{s.dir}, elems...)...)
}

var idRE = regexp.MustCompile(`^ck-[0-9a-f]{16}$`)

func (s *Store) readIndex() (index, error) {
	var ix index
	b, err := os.ReadFile(s.path("index.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return ix, nil
	}
	if err != nil {
		return ix, fmt.Errorf("read checkpoint index: %w", err)
	}
	if err := json.Unmarshal(b, &ix); err != nil {
		return ix, fmt.Errorf("read checkpoint index: %w", err)
	}
	return ix, nil
}

func (s *Store) writeIndex(ix index) error {
	b, err := json.Marshal(ix)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFileSync(s.path("index.json"), b, 0o600); err != nil {
		return fmt.Errorf("write checkpoint index: %w", err)
	}
	return atomicfile.SyncDir(s.dir)
}

// List returns the checkpoints in the order they were made or imported.
func (s *Store) List() ([]Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ix, err := s.readIndex()
	return ix.Checkpoints, err
}

// Get returns checkpoint id, or ErrUnknown.
func (s *Store) Get(id string) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(id)
}

func (s *Store) get(id string) (Info, error) {
	if !idRE.MatchString(id) {
		return Info{}, fmt.Errorf("checkpoint %q: %w", id, ErrUnknown)
	}
	ix, err := s.readIndex()
	if err != nil {
		return Info{}, err
	}
	if i := slices.IndexFunc(ix.Checkpoints, func(c Info) bool { return c.ID == id }); i >= 0 {
		return ix.Checkpoints[i], nil
	}
	return Info{}, fmt.Errorf("checkpoint %q: %w", id, ErrUnknown)
}

func (s *Store) readSnapshot(id string) (snapshot, error) {
	var sn snapshot
	b, err := os.ReadFile(s.path("snapshots", id+".json"))
	if err != nil {
		return sn, fmt.Errorf("read snapshot %s: %w: %w", id, err, ErrCorrupt)
	}
	if err := json.Unmarshal(b, &sn); err != nil {
		return sn, fmt.Errorf("read snapshot %s: %w: %w", id, err, ErrCorrupt)
	}
	return sn, nil
}

// DiskUsage is the bytes the store occupies on disk (allocated blocks of
// every file in it): what its sandbox's checkpoints cost against a disk
// budget.
func (s *Store) DiskUsage() (int64, error) {
	return DirUsage(s.dir)
}

// DirUsage is the allocated bytes of every file under dir; 0 when dir
// does not exist.
func DirUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return nil // removed while walking
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure checkpoint store: %w", err)
	}
	return n, nil
}

// crash is a test hook: the crash tests kill the process at a step.
var crash = func(step string) {}

func writeFileNoSync(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync checkpoint store: %w", err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync checkpoint store: %w", err)
	}
	return nil
}

func (s *Store) chunkPath(id string) string {
	return s.path("chunks", id[:2], id)
}

// Delete removes checkpoint id and every chunk no other checkpoint names.
// Deleting an unknown id returns ErrUnknown.
func (s *Store) Delete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ix, err := s.readIndex()
	if err != nil {
		return err
	}
	i := slices.IndexFunc(ix.Checkpoints, func(c Info) bool { return c.ID == id })
	if i < 0 {
		return fmt.Errorf("checkpoint %q: %w", id, ErrUnknown)
	}
	ix.Checkpoints = slices.Delete(ix.Checkpoints, i, i+1)
	if err := s.writeIndex(ix); err != nil {
		return err
	}
	return s.gc()
}

// gc removes snapshots the index does not list and chunks no listed
// snapshot names.
func (s *Store) gc() error {
	ix, err := s.readIndex()
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	listed := map[string]bool{}
	for _, c := range ix.Checkpoints {
		listed[c.ID+".json"] = true
		sn, err := s.readSnapshot(c.ID)
		if err != nil {
			// A listed snapshot that cannot be read: keep every chunk
			// rather than guess which are free.
			return fmt.Errorf("collect checkpoint chunks: %w", err)
		}
		for _, t := range sn.Trees {
			for _, e := range t {
				for _, id := range e.Chunks {
					keep[id] = true
				}
			}
		}
	}
	snaps, err := os.ReadDir(s.path("snapshots"))
	if err != nil {
		return fmt.Errorf("collect checkpoint chunks: %w", err)
	}
	for _, d := range snaps {
		if !listed[d.Name()] {
			os.Remove(s.path("snapshots", d.Name()))
		}
	}
	return filepath.WalkDir(s.path("chunks"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("collect checkpoint chunks: %w", err)
		}
		if !d.IsDir() && !keep[d.Name()] {
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("collect checkpoint chunks: %w", err)
			}
		}
		return nil
	})
}
