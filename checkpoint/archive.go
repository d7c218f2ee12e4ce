package checkpoint

// Archives: one checkpoint as a self-describing byte stream (Export) that
// another Store takes in whole or not at all (Import). The byte layout is
// docs/archive.md's, for readers in any language; the limits below are
// part of it.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/restic/chunker"
)

const (
	// arcMagic opens every archive; arcVersion follows it. A reader
	// refuses any version it does not know (a new record kind or field
	// meaning is a new version).
	arcMagic   = "RUNNERCK"
	arcVersion = 1

	recSnapshot = 1
	recChunk    = 2
	recEnd      = 3

	// maxSnapshot bounds a snapshot's JSON (decompressed) and its
	// compressed frame: about 500,000 files. Export refuses a larger one
	// (ErrInvalid), so it never writes what Import would refuse.
	maxSnapshot = 128 << 20
	// maxFrame bounds a chunk record's zstd frame: a chunk is at most
	// chunker.MaxSize (8 MiB) plain, and zstd's worst case adds far less
	// than the 1 MiB allowed on top.
	maxFrame = chunker.MaxSize + 1<<20
	// maxWindow bounds a zstd frame's window (what a decoder must keep):
	// the encoder's default, 8 MiB, which also covers a single-segment
	// frame of a whole chunk.
	maxWindow = 8 << 20
	recHead   = 5  // kind (1 byte) + payload length (uint32)
	endLen    = 20 // chunk records (uint64) + bytes before (uint64) + CRC-32C (uint32)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// arcSnapshot is the archive's snapshot: the checkpoint's Info and trees
// in a form with no Go-specific encoding (mode as POSIX bits, the type as
// a word), docs/archive.md.
type arcSnapshot struct {
	ID       string       `json:"id"`
	Comment  string       `json:"comment,omitempty"`
	Created  time.Time    `json:"created"`
	Size     int64        `json:"size"`
	Files    int          `json:"files"`
	Skipped  int          `json:"skipped"`
	FrozenNS int64        `json:"frozen_ns"`
	Trees    [][]arcEntry `json:"trees"`
}

type arcEntry struct {
	Path    string   `json:"path"`
	Type    string   `json:"type"` // "dir", "file" or "symlink"
	Mode    uint32   `json:"mode"` // permission bits with setuid 04000, setgid 02000, sticky 01000
	UID     uint32   `json:"uid"`
	GID     uint32   `json:"gid"`
	MtimeNS int64    `json:"mtime_ns"`
	Target  string   `json:"target,omitempty"`
	Size    int64    `json:"size,omitempty"`
	Chunks  []string `json:"chunks,omitempty"`
}

func toArc(sn snapshot) arcSnapshot {
	a := arcSnapshot{ID: sn.Info.ID, Comment: sn.Info.Comment, Created: sn.Info.Created, Size: sn.Info.Size,
		Files: sn.Info.Files, Skipped: sn.Info.Skipped, FrozenNS: int64(sn.Info.Frozen)}
	for _, t := range sn.Trees {
		at := make([]arcEntry, len(t))
		for i, e := range t {
			m := uint32(e.Mode.Perm())
			for bit, posix := range modeBits {
				if e.Mode&bit != 0 {
					m |= posix
				}
			}
			typ := "file"
			if e.Mode.IsDir() {
				typ = "dir"
			} else if e.Mode&fs.ModeSymlink != 0 {
				typ = "symlink"
			}
			at[i] = arcEntry{Path: e.Path, Type: typ, Mode: m, UID: uint32(e.UID), GID: uint32(e.GID),
				MtimeNS: e.Mtime, Target: e.Target, Size: e.Size, Chunks: e.Chunks}
		}
		a.Trees = append(a.Trees, at)
	}
	return a
}

var modeBits = map[fs.FileMode]uint32{fs.ModeSetuid: 0o4000, fs.ModeSetgid: 0o2000, fs.ModeSticky: 0o1000}

var arcTypes = map[string]fs.FileMode{"dir": fs.ModeDir, "file": 0, "symlink": fs.ModeSymlink}

// fromArc is the store's snapshot of an archive's, checked: every tree
// passes checkTree and Info's size and file count are the trees'.
func fromArc(a arcSnapshot) (snapshot, error) {
	if !idRE.MatchString(a.ID) {
		return snapshot{}, fmt.Errorf("checkpoint id %q: %w", a.ID, ErrCorrupt)
	}
	if a.Size < 0 || a.Files < 0 || a.Skipped < 0 || a.FrozenNS < 0 {
		return snapshot{}, fmt.Errorf("negative count in the checkpoint's info: %w", ErrCorrupt)
	}
	sn := snapshot{Info: Info{ID: a.ID, Comment: a.Comment, Created: a.Created, Size: a.Size,
		Files: a.Files, Skipped: a.Skipped, Frozen: time.Duration(a.FrozenNS)}}
	var size int64
	files := 0
	for _, at := range a.Trees {
		t := make([]entry, len(at))
		for i, e := range at {
			typ, ok := arcTypes[e.Type]
			if !ok || e.Mode&^0o7777 != 0 {
				return snapshot{}, fmt.Errorf("entry %q: type %q mode %o: %w", e.Path, e.Type, e.Mode, ErrCorrupt)
			}
			m := typ | fs.FileMode(e.Mode&0o777)
			for bit, posix := range modeBits {
				if e.Mode&posix != 0 {
					m |= bit
				}
			}
			t[i] = entry{Path: e.Path, Mode: m, UID: int(e.UID), GID: int(e.GID), Mtime: e.MtimeNS,
				Target: e.Target, Size: e.Size, Chunks: e.Chunks}
			if typ == 0 {
				files++
				size += e.Size
				if size < 0 {
					return snapshot{}, fmt.Errorf("file sizes overflow: %w", ErrCorrupt)
				}
			}
		}
		if err := checkTree(t); err != nil {
			return snapshot{}, err
		}
		sn.Trees = append(sn.Trees, t)
	}
	if size != a.Size || files != a.Files {
		return snapshot{}, fmt.Errorf("info says %d files of %d bytes, the trees hold %d of %d: %w",
			a.Files, a.Size, files, size, ErrCorrupt)
	}
	return sn, nil
}

// Chunks returns whether checkpoint id names a chunk: pass it to Export
// as have when the receiver holds id already (it imported it earlier), so
// the archive carries only what changed since.
func (s *Store) Chunks(id string) (func(chunk string) bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(id); err != nil {
		return nil, err
	}
	sn, err := s.readSnapshot(id)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, t := range sn.Trees {
		for _, e := range t {
			for _, c := range e.Chunks {
				set[c] = true
			}
		}
	}
	return func(c string) bool { return set[c] }, nil
}

// HasChunk reports whether the store holds chunk id (a receiver's answer
// to a sender's have).
func (s *Store) HasChunk(id string) bool {
	if !chunkRE.MatchString(id) {
		return false
	}
	_, err := os.Stat(s.chunkPath(id))
	return err == nil
}

// arcWriter counts and checksums what it writes.
type arcWriter struct {
	w   io.Writer
	n   int64
	crc uint32
}

func (a *arcWriter) Write(p []byte) (int, error) {
	n, err := a.w.Write(p)
	a.n += int64(n)
	a.crc = crc32.Update(a.crc, castagnoli, p[:n])
	return n, err
}

func (a *arcWriter) record(kind byte, parts ...[]byte) error {
	var n int
	for _, p := range parts {
		n += len(p)
	}
	var h [recHead]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	if _, err := a.Write(h[:]); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := a.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// Export writes checkpoint id to w as an archive (docs/archive.md): its
// snapshot, then each chunk it names that have does not report (have nil:
// every chunk), each once. It returns the bytes written. Chunks are sent
// as stored (compressed, not re-checked: the importer checks every one),
// read ahead on every core. It returns ErrUnknown for an unknown id,
// ErrCorrupt when a chunk of the checkpoint is missing from the store and
// ErrInvalid when the snapshot exceeds the archive's limit.
func (s *Store) Export(ctx context.Context, id string, w io.Writer, have func(chunk string) bool) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(id); err != nil {
		return 0, err
	}
	sn, err := s.readSnapshot(id)
	if err != nil {
		return 0, err
	}
	js, err := json.Marshal(toArc(sn))
	if err != nil {
		return 0, fmt.Errorf("export %s: %w", id, err)
	}
	if len(js) > maxSnapshot {
		return 0, fmt.Errorf("export %s: snapshot of %d bytes, the archive's limit is %d: %w", id, len(js), maxSnapshot, ErrInvalid)
	}
	var ids []string
	seen := map[string]bool{}
	for _, t := range sn.Trees {
		for _, e := range t {
			for _, c := range e.Chunks {
				if !seen[c] && (have == nil || !have(c)) {
					ids = append(ids, c)
				}
				seen[c] = true
			}
		}
	}

	aw := &arcWriter{w: w}
	var head [12]byte
	copy(head[:], arcMagic)
	binary.BigEndian.PutUint32(head[8:], arcVersion)
	if _, err := aw.Write(head[:]); err != nil {
		return aw.n, fmt.Errorf("export %s: %w", id, err)
	}
	sum := sha256.Sum256(js)
	if err := aw.record(recSnapshot, sum[:], s.enc.EncodeAll(js, nil)); err != nil {
		return aw.n, fmt.Errorf("export %s: %w", id, err)
	}
	if err := s.sendChunks(ctx, aw, ids); err != nil {
		return aw.n, fmt.Errorf("export %s: %w", id, err)
	}
	var end [endLen]byte
	binary.BigEndian.PutUint64(end[0:], uint64(len(ids)))
	binary.BigEndian.PutUint64(end[8:], uint64(aw.n))
	binary.BigEndian.PutUint32(end[16:], aw.crc)
	if err := aw.record(recEnd, end[:]); err != nil {
		return aw.n, fmt.Errorf("export %s: %w", id, err)
	}
	return aw.n, nil
}

// sendChunks writes a chunk record for each of ids, in order, while up to
// one reader per core reads the chunks ahead.
func (s *Store) sendChunks(ctx context.Context, aw *arcWriter, ids []string) error {
	type fetch struct {
		id   string
		z    []byte
		err  error
		done chan struct{}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := max(parallel(), 1)
	jobs := make(chan *fetch, n)
	ordered := make(chan *fetch, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	for range n {
		wg.Go(func() {
			for f := range jobs {
				f.z, f.err = os.ReadFile(s.chunkPath(f.id))
				if errors.Is(f.err, fs.ErrNotExist) {
					f.err = fmt.Errorf("chunk %s: %w: %w", f.id, f.err, ErrCorrupt)
				} else if f.err == nil && len(f.z) > maxFrame {
					f.err = fmt.Errorf("chunk %s: %d bytes stored: %w", f.id, len(f.z), ErrCorrupt)
				}
				close(f.done)
			}
		})
	}
	wg.Go(func() {
		defer close(ordered)
		defer close(jobs)
		for _, id := range ids {
			f := &fetch{id: id, done: make(chan struct{})}
			select {
			case jobs <- f:
			case <-ctx.Done():
				return
			}
			select {
			case ordered <- f:
			case <-ctx.Done():
				return
			}
		}
	})
	var err error
	for f := range ordered {
		<-f.done
		if err != nil {
			continue // drain
		}
		if f.err != nil {
			err = f.err
		} else {
			sum, _ := hex.DecodeString(f.id)
			err = aw.record(recChunk, sum, f.z)
		}
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			cancel()
		}
	}
	return err
}
