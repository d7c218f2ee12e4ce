package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/restic/chunker"
)

// arcReader counts and checksums what it reads; Import reads exactly the
// archive's bytes from r, never past its end record.
type arcReader struct {
	r   io.Reader
	n   int64
	crc uint32
}

func (a *arcReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	a.n += int64(n)
	a.crc = crc32.Update(a.crc, castagnoli, p[:n])
	return n, err
}

func (a *arcReader) full(p []byte) error {
	if _, err := io.ReadFull(a, p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("archive truncated at byte %d: %w", a.n, ErrCorrupt)
		}
		return fmt.Errorf("read archive: %w", err)
	}
	return nil
}

// payload reads n bytes, growing its buffer only as they arrive, so a
// length field that lies costs no allocation beyond what was sent.
func (a *arcReader) payload(n int64) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(int(min(n, 1<<20)))
	if _, err := io.CopyN(&b, a, n); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("archive truncated at byte %d: %w", a.n, ErrCorrupt)
		}
		return nil, fmt.Errorf("read archive: %w", err)
	}
	return b.Bytes(), nil
}

func (a *arcReader) head() (kind byte, n int64, err error) {
	var h [recHead]byte
	if err := a.full(h[:]); err != nil {
		return 0, 0, err
	}
	return h[0], int64(binary.BigEndian.Uint32(h[1:])), nil
}

// readSnapshotRecord reads and checks the archive's header and snapshot.
func (s *Store) readSnapshotRecord(ar *arcReader) (snapshot, error) {
	var head [12]byte
	if err := ar.full(head[:]); err != nil {
		return snapshot{}, err
	}
	if string(head[:8]) != arcMagic {
		return snapshot{}, fmt.Errorf("not a checkpoint archive: %w", ErrCorrupt)
	}
	if v := binary.BigEndian.Uint32(head[8:]); v != arcVersion {
		return snapshot{}, fmt.Errorf("archive version %d, this reader knows %d: %w", v, arcVersion, ErrCorrupt)
	}
	kind, n, err := ar.head()
	if err != nil {
		return snapshot{}, err
	}
	if kind != recSnapshot || n < sha256.Size || n > sha256.Size+maxSnapshot {
		return snapshot{}, fmt.Errorf("first record: kind %d of %d bytes, want a snapshot of at most %d: %w", kind, n, sha256.Size+maxSnapshot, ErrCorrupt)
	}
	p, err := ar.payload(n)
	if err != nil {
		return snapshot{}, err
	}
	js, err := decompressSnapshot(p[sha256.Size:])
	if err != nil {
		return snapshot{}, err
	}
	if sum := sha256.Sum256(js); !bytes.Equal(sum[:], p[:sha256.Size]) {
		return snapshot{}, fmt.Errorf("snapshot does not match its hash: %w", ErrCorrupt)
	}
	var a arcSnapshot
	if err := json.Unmarshal(js, &a); err != nil {
		return snapshot{}, fmt.Errorf("parse snapshot: %w: %w", err, ErrCorrupt)
	}
	return fromArc(a)
}

// decompressSnapshot decompresses a snapshot's frames twice: once to count
// the bytes (refusing more than maxSnapshot), then into a buffer of exactly
// that size, so a frame that claims or inflates to more costs no more
// memory than the decoder's window (at most maxWindow).
func decompressSnapshot(z []byte) ([]byte, error) {
	open := func() (*zstd.Decoder, error) {
		zr, err := zstd.NewReader(bytes.NewReader(z), zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxMemory(maxSnapshot), zstd.WithDecoderMaxWindow(maxWindow))
		if err != nil {
			return nil, fmt.Errorf("read snapshot: %w", err)
		}
		return zr, nil
	}
	zr, err := open()
	if err != nil {
		return nil, err
	}
	n, err := io.Copy(io.Discard, io.LimitReader(zr, maxSnapshot+1))
	zr.Close()
	if err != nil {
		return nil, fmt.Errorf("decompress snapshot: %w: %w", err, ErrCorrupt)
	}
	if n > maxSnapshot {
		return nil, fmt.Errorf("snapshot over %d bytes: %w", maxSnapshot, ErrCorrupt)
	}
	if zr, err = open(); err != nil {
		return nil, err
	}
	defer zr.Close()
	js := make([]byte, n)
	if _, err := io.ReadFull(zr, js); err != nil {
		return nil, fmt.Errorf("decompress snapshot: %w: %w", err, ErrCorrupt)
	}
	return js, nil
}

// Import reads one archive from r (as Export writes it) into the store and
// returns the checkpoint's Info, Stored being what the import added here.
// Every chunk is decompressed and its hash checked, the snapshot's hash
// and shape (no path that leaves its tree), the records' framing and the
// stream's CRC-32C too; every chunk the snapshot names must be in the
// archive or already in the store. Anything else fails with an error
// wrapping ErrCorrupt and leaves the store as it was: no checkpoint
// listed, no chunk kept (a kill -9 midway: the next Open removes them, as
// for Create). Importing a checkpoint the store lists already changes
// nothing and returns it; one with the same id and other content fails
// with ErrInvalid.
func (s *Store) Import(ctx context.Context, r io.Reader) (Info, error) {
	return s.importArchive(ctx, r, nil)
}

// importArchive is Import, with every entry given to owner when it is not
// nil (ImportAs).
func (s *Store) importArchive(ctx context.Context, r io.Reader, owner *Owner) (info Info, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ar := &arcReader{r: r}
	sn, err := s.readSnapshotRecord(ar)
	if err != nil {
		return Info{}, fmt.Errorf("import checkpoint: %w", err)
	}
	if owner != nil {
		owner.apply(&sn)
	}
	id := sn.Info.ID
	ix, err := s.readIndex()
	if err != nil {
		return Info{}, err
	}
	existing, err := s.listed(ix, sn)
	if err != nil {
		return Info{}, err
	}
	need := map[string]bool{} // named by the snapshot; true once received
	for _, t := range sn.Trees {
		for _, e := range t {
			for _, c := range e.Chunks {
				need[c] = false
			}
		}
	}

	im := &importer{s: s, ctx: ctx, keep: existing < 0}
	if im.keep {
		if err := os.WriteFile(s.path("dirty"), nil, 0o600); err != nil {
			return Info{}, fmt.Errorf("import checkpoint: %w", err)
		}
		defer func() {
			if err != nil {
				for _, p := range im.written {
					os.Remove(p)
					os.Remove(filepath.Dir(p)) // its shard, if this emptied it
				}
				os.Remove(s.path("snapshots", id+".json.tmp"))
				os.Remove(s.path("snapshots", id+".json"))
				os.Remove(s.path("dirty"))
				info = Info{}
			}
		}()
	}
	if err := im.chunks(ar, need); err != nil {
		return Info{}, fmt.Errorf("import checkpoint %s: %w", id, err)
	}
	for c, got := range need {
		if !got && !s.HasChunk(c) {
			return Info{}, fmt.Errorf("import checkpoint %s: chunk %s neither in the archive nor in the store: %w", id, c, ErrCorrupt)
		}
	}
	if !im.keep {
		return ix.Checkpoints[existing], nil
	}
	crash("import-chunks")
	sn.Info.Stored = im.stored
	b, err := json.Marshal(sn)
	if err != nil {
		return Info{}, err
	}
	sn.Info.Stored += int64(len(b)) // as Create counts its snapshot file
	if err := writeFileNoSync(s.path("snapshots", id+".json"), b); err != nil {
		return Info{}, fmt.Errorf("import checkpoint %s: write snapshot: %w", id, err)
	}
	if err := syncfs(s.dir); err != nil {
		return Info{}, err
	}
	crash("import-snapshot")
	ix.Checkpoints = append(ix.Checkpoints, sn.Info)
	if err := s.writeIndex(ix); err != nil {
		return Info{}, err
	}
	crash("import-index")
	os.Remove(s.path("dirty"))
	return sn.Info, nil
}

// listed returns where ix lists sn's checkpoint (-1: nowhere), and
// ErrInvalid when it lists that id with other trees.
func (s *Store) listed(ix index, sn snapshot) (int, error) {
	id := sn.Info.ID
	i := slices.IndexFunc(ix.Checkpoints, func(c Info) bool { return c.ID == id })
	if i < 0 {
		return -1, nil
	}
	old, err := s.readSnapshot(id)
	if err != nil {
		return -1, err
	}
	if !sameTrees(old.Trees, sn.Trees) {
		return -1, fmt.Errorf("import checkpoint %s: the store holds another checkpoint of that id: %w", id, ErrInvalid)
	}
	return i, nil
}

// sameTrees compares two snapshots' trees as an archive carries them
// (inode and ctime, kept by Create to skip unchanged files, are the
// sending host's and not in an archive).
func sameTrees(a, b [][]entry) bool {
	strip := func(ts [][]entry) [][]entry {
		out := make([][]entry, len(ts))
		for i, t := range ts {
			out[i] = make([]entry, len(t))
			for j, e := range t {
				e.Ino, e.Ctime = 0, 0
				if len(e.Chunks) == 0 {
					e.Chunks = nil
				}
				out[i][j] = e
			}
		}
		return out
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// importer is one Import's chunk stage: the caller's goroutine reads the
// records, one worker per core decompresses, checks and writes them.
type importer struct {
	s    *Store
	ctx  context.Context
	keep bool // write the chunks (false: the checkpoint is listed already)

	mu      sync.Mutex // guards what follows
	written []string
	stored  int64
}

type importJob struct {
	id string
	z  []byte
}

// chunks reads chunk records up to and including the end record, marking
// each chunk received in need; each must be named there and come once.
func (im *importer) chunks(ar *arcReader, need map[string]bool) error {
	ctx, cancel := context.WithCancelCause(im.ctx)
	defer cancel(nil)
	n := max(parallel(), 1)
	jobs := make(chan importJob, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			buf := make([]byte, 0, chunker.MaxSize)
			for j := range jobs {
				if ctx.Err() != nil {
					continue
				}
				if err := im.put(j, buf); err != nil {
					cancel(err)
				}
			}
		})
	}
	err := func() error {
		defer close(jobs)
		var count uint64
		for {
			before, crc := ar.n, ar.crc
			kind, n, err := ar.head()
			if err != nil {
				return err
			}
			switch kind {
			case recChunk:
				if n < sha256.Size || n > sha256.Size+maxFrame {
					return fmt.Errorf("chunk record of %d bytes, the limit is %d: %w", n, sha256.Size+maxFrame, ErrCorrupt)
				}
				p, err := ar.payload(n)
				if err != nil {
					return err
				}
				id := hex.EncodeToString(p[:sha256.Size])
				got, named := need[id]
				if !named {
					return fmt.Errorf("chunk %s not named by the snapshot: %w", id, ErrCorrupt)
				}
				if got {
					return fmt.Errorf("chunk %s twice: %w", id, ErrCorrupt)
				}
				need[id] = true
				count++
				select {
				case jobs <- importJob{id: id, z: p[sha256.Size:]}:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			case recEnd:
				if n != endLen {
					return fmt.Errorf("end record of %d bytes, want %d: %w", n, endLen, ErrCorrupt)
				}
				var end [endLen]byte
				if err := ar.full(end[:]); err != nil {
					return err
				}
				if c, b, sum := binary.BigEndian.Uint64(end[0:]), binary.BigEndian.Uint64(end[8:]), binary.BigEndian.Uint32(end[16:]); c != count || b != uint64(before) || sum != crc {
					return fmt.Errorf("end record says %d chunks in %d bytes (crc %08x), the archive had %d in %d (crc %08x): %w",
						c, b, sum, count, before, crc, ErrCorrupt)
				}
				return nil
			default:
				return fmt.Errorf("record kind %d: %w", kind, ErrCorrupt)
			}
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
		}
	}()
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil {
		return cause
	}
	return err
}

// put checks one received chunk and, unless the store has it, writes it
// as it came (the frame that was just checked to decode to id).
func (im *importer) put(j importJob, buf []byte) error {
	if _, err := im.s.decode(j.id, j.z, buf); err != nil {
		return fmt.Errorf("chunk %s: %w", j.id, err)
	}
	if !im.keep {
		return nil
	}
	p := im.s.chunkPath(j.id)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("store chunk: %w", err)
	}
	im.mu.Lock()
	im.written = append(im.written, p)
	im.mu.Unlock()
	if err := writeFileNoSync(p, j.z); err != nil {
		return fmt.Errorf("store chunk: %w", err)
	}
	crash("import-chunk")
	im.mu.Lock()
	im.stored += int64(len(j.z))
	im.mu.Unlock()
	return nil
}
