package checkpoint

// The capture pipeline of one Create. One walker (the caller's goroutine)
// walks the trees in order and opens each file that changed; chunkers
// (one per core) each cut one file into content-defined chunks; hashers
// (one per core) hash, compress and write the chunks. Channels between the
// stages hold at most one item per worker, so memory is bounded by about
// four chunk buffers (chunker.MaxSize) per worker whatever the tree. The
// snapshot is the walk's order and each file's chunks in file order, so it
// is the same whatever the number of workers
// (TestParallelCreateSameChunks).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"github.com/restic/chunker"
	"golang.org/x/sys/unix"
)

// parallel is how many chunkers and hashers a Create runs, and how many
// files a restore writes at once: every core. Tests set it.
var parallel = func() int { return runtime.GOMAXPROCS(0) }

// capture is one Create's pipeline. Its goroutines are started by run and
// have all returned when run returns.
type capture struct {
	s    *Store
	prev map[[2]string]entry
	info *Info // Files, Size and Skipped, counted by the walker

	ctx    context.Context // the pipeline's: canceled on the first failure
	cancel context.CancelFunc
	files  chan fileJob
	chunks chan *chunkJob
	fixups []fixup // walker only
	bufs   sync.Pool

	mu      sync.Mutex // guards what follows
	err     error      // the first failure
	claimed map[string]bool
	written []string // chunk files this Create added
	stored  int64    // their compressed bytes
}

type fileJob struct {
	f   *os.File // owned by the chunker that takes the job
	p   string
	ids *[]string
}

type chunkJob struct {
	data []byte // from c.bufs; the hasher returns it
	id   string // set by the hasher before done is closed
	done chan struct{}
}

// fixup is where a file's chunk ids go once its chunker is done.
type fixup struct {
	ri, idx int
	ids     *[]string
}

func newCapture(ctx context.Context, s *Store, prev map[[2]string]entry, info *Info) *capture {
	c := &capture{s: s, prev: prev, info: info, claimed: map[string]bool{}}
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.bufs.New = func() any { b := make([]byte, chunker.MaxSize); return &b }
	return c
}

// stop releases a capture that never ran.
func (c *capture) stop() { c.cancel() }

// fail records the first failure and stops every stage.
func (c *capture) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.cancel()
}

// run walks roots into trees through the pipeline, calls read once every
// file's content has been read (Create thaws there), and returns when
// every goroutine it started has returned: the first failure, or nil with
// every chunk written (not yet synced) and every entry's chunk ids set.
func (c *capture) run(roots []string, trees [][]entry, read func()) error {
	defer c.cancel()
	n := max(parallel(), 1)
	c.files = make(chan fileJob, n)
	c.chunks = make(chan *chunkJob, n)
	var chunkers, hashers sync.WaitGroup
	for range n {
		chunkers.Go(c.chunker)
		hashers.Go(c.hasher)
	}
	for i, root := range roots {
		t, err := c.walk(c.ctx, i, root)
		if err != nil {
			c.fail(err)
			break
		}
		trees[i] = t
	}
	close(c.files)
	chunkers.Wait()
	read()
	close(c.chunks)
	hashers.Wait()
	if c.err != nil {
		return c.err
	}
	if err := c.ctx.Err(); err != nil {
		return err // the caller's context, canceled after the walk
	}
	for _, f := range c.fixups {
		trees[f.ri][f.idx].Chunks = *f.ids
	}
	return nil
}

// dispatch hands file f (entry idx of tree ri) to a chunker, which closes it.
func (c *capture) dispatch(f *os.File, p string, ri, idx int) error {
	j := fileJob{f: f, p: p, ids: new([]string)}
	select {
	case c.files <- j:
		c.fixups = append(c.fixups, fixup{ri, idx, j.ids})
		return nil
	case <-c.ctx.Done():
		f.Close()
		return c.ctx.Err()
	}
}

func (c *capture) chunker() {
	buf := make([]byte, chunker.MaxSize)
	// One Chunker per goroutine, Reset for each file: New allocates (and
	// zeroes) a 512 KiB read buffer, 5 GiB over 10,000 files.
	ch := chunker.New(nil, pol)
	for j := range c.files {
		if err := c.chunkFile(j, ch, buf); err != nil {
			c.fail(err)
		}
	}
}

// chunkFile cuts one file into chunks, hands each to a hasher and, once
// every one is hashed, records their ids in order.
func (c *capture) chunkFile(j fileJob, ch *chunker.Chunker, buf []byte) error {
	defer j.f.Close()
	if c.ctx.Err() != nil {
		return nil // drained after a failure
	}
	var pending []*chunkJob
	ch.Reset(j.f, pol)
	for {
		chunk, err := ch.Next(buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", j.p, err)
		}
		bp := c.bufs.Get().(*[]byte)
		cj := &chunkJob{data: append((*bp)[:0], chunk.Data...), done: make(chan struct{})}
		select {
		case c.chunks <- cj:
		case <-c.ctx.Done():
			c.bufs.Put(bp)
			return nil
		}
		pending = append(pending, cj)
	}
	ids := make([]string, len(pending))
	for i, cj := range pending {
		<-cj.done // a hasher always closes it, failure or not
		ids[i] = cj.id
	}
	*j.ids = ids
	return nil
}

func (c *capture) hasher() {
	var z []byte
	for cj := range c.chunks {
		var err error
		z, err = c.put(cj, z)
		data := cj.data
		cj.data = nil
		c.bufs.Put(&data)
		close(cj.done)
		if err != nil {
			c.fail(err)
		}
	}
}

// put stores one chunk unless the store has it or another hasher of this
// Create took it; z is the hasher's compression buffer, returned for reuse.
func (c *capture) put(cj *chunkJob, z []byte) ([]byte, error) {
	sum := sha256.Sum256(cj.data)
	id := hex.EncodeToString(sum[:])
	cj.id = id
	if c.ctx.Err() != nil {
		return z, nil
	}
	c.mu.Lock()
	taken := c.claimed[id]
	c.claimed[id] = true
	c.mu.Unlock()
	if taken {
		return z, nil
	}
	p := c.s.chunkPath(id)
	if _, err := os.Stat(p); err == nil {
		return z, nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return z, fmt.Errorf("store chunk: %w", err)
	}
	z = c.s.enc.EncodeAll(cj.data, z[:0])
	// Recorded before the write, so a failed Create removes a partial one.
	c.mu.Lock()
	c.written = append(c.written, p)
	c.mu.Unlock()
	if err := writeFileNoSync(p, z); err != nil {
		return z, fmt.Errorf("store chunk: %w", err)
	}
	crash("chunk")
	c.mu.Lock()
	c.stored += int64(len(z))
	c.mu.Unlock()
	return z, nil
}

// walk records the tree at root. It works from directory descriptors:
// each entry is looked at (fstatat, no follow) and opened (O_NOFOLLOW)
// relative to its directory's descriptor, never by a path, so a process
// that swaps a directory for a symlink while the walk runs (one not
// frozen: another sandbox running as the same user) cannot lead root's
// reads out of the tree; a file is read through the descriptor its
// entry's metadata comes from. Order is filepath.WalkDir's: depth first,
// each directory's entries by name.
func (c *capture) walk(ctx context.Context, ri int, root string) ([]entry, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", root, err)
	}
	var out []entry
	err = c.walkDir(ctx, ri, fd, root, ".", &out)
	return out, err
}

// walkDir records the directory open at fd (its path p, rel below the
// root) and everything below it, and closes fd.
func (c *capture) walkDir(ctx context.Context, ri int, fd int, p, rel string, out *[]entry) error {
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	*out = append(*out, entryOf(rel, &st))
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("walk %s: %w", p, err)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		cp, crel := filepath.Join(p, name), filepath.Join(rel, name)
		var lst unix.Stat_t
		if err := unix.Fstatat(fd, name, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat %s: %w", cp, err)
		}
		switch lst.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			// ENOTDIR or ELOOP: swapped for something else since the stat.
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s: %w", cp, err)
			}
			if err := c.walkDir(ctx, ri, cfd, cp, crel, out); err != nil {
				return err
			}
		case unix.S_IFLNK:
			e := entryOf(crel, &lst)
			buf := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(fd, name, buf)
			if err != nil {
				return fmt.Errorf("read link %s: %w", cp, err)
			}
			e.Target = string(buf[:n])
			*out = append(*out, e)
		case unix.S_IFREG:
			e, err := c.fileAt(ri, len(*out), fd, name, cp, crel)
			if err != nil {
				return err
			}
			*out = append(*out, e)
		default:
			c.info.Skipped++
		}
	}
	return nil
}

// entryOf is the entry of rel with the metadata st.
func entryOf(rel string, st *unix.Stat_t) entry {
	return entry{Path: rel, Mode: fileMode(st.Mode), UID: int(st.Uid), GID: int(st.Gid), Mtime: st.Mtim.Nano()}
}

// fileMode is st_mode as an fs.FileMode, as package os makes it.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// fileAt records the regular file name in the directory open at dfd:
// opened with O_NOFOLLOW (and O_NONBLOCK, so a fifo swapped in cannot
// block the walk), its metadata taken from the opened file, which must
// still be a regular file, and its content chunked unless it is
// unchanged since the newest checkpoint.
func (c *capture) fileAt(ri, idx, dfd int, name, p, rel string) (entry, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return entry{}, fmt.Errorf("open %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return entry{}, fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return entry{}, fmt.Errorf("read %s: no longer a regular file", p)
	}
	e := entryOf(rel, &st)
	e.Size, e.Ino, e.Ctime = st.Size, st.Ino, st.Ctim.Nano()
	c.info.Files++
	c.info.Size += st.Size
	if old, ok := c.prev[[2]string{fmt.Sprint(ri), rel}]; ok && old.Ino == e.Ino && old.Size == e.Size &&
		old.Mtime == e.Mtime && old.Ctime == e.Ctime && old.Mode == e.Mode {
		f.Close()
		e.Chunks = old.Chunks // unchanged since the last checkpoint
		return e, nil
	}
	// The chunkers read it; the walk goes on meanwhile. Its chunk ids
	// land in the entry once the pipeline is done (c.fixups).
	return e, c.dispatch(f, p, ri, idx)
}
