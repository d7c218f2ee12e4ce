package checkpoint

// Create: a checkpoint captured. The capture walks each tree from
// directory descriptors (never a path root could be led out by), splits
// files into content-addressed chunks and stores the ones not yet held.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/restic/chunker"
	"golang.org/x/sys/unix"
)

// Options shape one checkpoint.
type Options struct {
	Comment string
	// Freeze, when set, stops the sandbox's processes; Create calls it
	// before walking the trees and the thaw it returns once every file's
	// content is captured (and always, on failure).
	Freeze func(ctx context.Context) (thaw func() error, err error)
}

// Create captures the trees rooted at roots (the sandbox's disk, in a
// fixed order) as a new checkpoint. On any failure (a full disk
// included: errors.Is(err, unix.ENOSPC)) nothing of it is kept.
func (s *Store) Create(ctx context.Context, roots []string, opt Options) (info Info, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rnd [8]byte
	rand.Read(rnd[:])
	info = Info{ID: "ck-" + hex.EncodeToString(rnd[:]), Comment: opt.Comment, Created: time.Now().UTC()}

	ix, err := s.readIndex()
	if err != nil {
		return Info{}, err
	}
	var prev map[[2]string]entry // (root index, path) of the newest checkpoint
	if n := len(ix.Checkpoints); n > 0 {
		if sn, err := s.readSnapshot(ix.Checkpoints[n-1].ID); err == nil && len(sn.Trees) == len(roots) {
			prev = map[[2]string]entry{}
			for i, t := range sn.Trees {
				for _, e := range t {
					prev[[2]string{fmt.Sprint(i), e.Path}] = e
				}
			}
		}
	}
	if err := os.WriteFile(s.path("dirty"), nil, 0o600); err != nil {
		return Info{}, fmt.Errorf("create checkpoint: %w", err)
	}
	c := &capture{s: s, prev: prev, info: &info}
	defer func() {
		if err != nil {
			// Nothing half-written is kept: the chunks this attempt wrote
			// (none is named by an indexed checkpoint) and its snapshot.
			for _, p := range c.written {
				os.Remove(p)
			}
			os.Remove(s.path("snapshots", info.ID+".json.tmp"))
			os.Remove(s.path("snapshots", info.ID+".json"))
			os.Remove(s.path("dirty"))
			info = Info{}
		}
	}()

	sn := snapshot{Trees: make([][]entry, len(roots))}
	if opt.Freeze != nil {
		thaw, err := opt.Freeze(ctx)
		if err != nil {
			return Info{}, fmt.Errorf("freeze: %w", err)
		}
		start := time.Now()
		for i, root := range roots {
			if sn.Trees[i], err = c.walk(ctx, i, root); err != nil {
				break
			}
		}
		info.Frozen = time.Since(start)
		if terr := thaw(); terr != nil && err == nil {
			err = fmt.Errorf("thaw: %w", terr)
		}
		if err != nil {
			return Info{}, err
		}
	} else {
		for i, root := range roots {
			if sn.Trees[i], err = c.walk(ctx, i, root); err != nil {
				return Info{}, err
			}
		}
	}
	crash("chunks")
	sn.Info = info
	b, err := json.Marshal(sn)
	if err != nil {
		return Info{}, err
	}
	if err := writeFileNoSync(s.path("snapshots", info.ID+".json"), b); err != nil {
		return Info{}, fmt.Errorf("write snapshot: %w", err)
	}
	info.Stored += int64(len(b))
	// One syncfs makes every chunk and the snapshot durable at once,
	// cheaper than an fsync per chunk.
	if err := syncfs(s.dir); err != nil {
		return Info{}, err
	}
	crash("snapshot")
	ix.Checkpoints = append(ix.Checkpoints, info)
	if err := s.writeIndex(ix); err != nil {
		return Info{}, err
	}
	crash("index")
	os.Remove(s.path("dirty"))
	return info, nil
}

// capture is one Create's walk.
type capture struct {
	s       *Store
	prev    map[[2]string]entry
	info    *Info
	written []string // chunk files this Create added
	buf     []byte
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
			e, err := c.fileAt(ri, fd, name, cp, crel)
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
func (c *capture) fileAt(ri, dfd int, name, p, rel string) (entry, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return entry{}, fmt.Errorf("open %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return entry{}, fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return entry{}, fmt.Errorf("read %s: no longer a regular file", p)
	}
	e := entryOf(rel, &st)
	e.Size, e.Ino, e.Ctime = st.Size, st.Ino, st.Ctim.Nano()
	c.info.Files++
	c.info.Size += st.Size
	if old, ok := c.prev[[2]string{fmt.Sprint(ri), rel}]; ok && old.Ino == e.Ino && old.Size == e.Size &&
		old.Mtime == e.Mtime && old.Ctime == e.Ctime && old.Mode == e.Mode {
		e.Chunks = old.Chunks // unchanged since the last checkpoint
		return e, nil
	}
	e.Chunks, err = c.chunks(f, p)
	return e, err
}

// chunks stores the content of f (path p, for errors) and returns its
// chunk ids.
func (c *capture) chunks(f *os.File, p string) ([]string, error) {
	if c.buf == nil {
		c.buf = make([]byte, chunker.MaxSize)
	}
	var ids []string
	ch := chunker.New(f, pol)
	for {
		chunk, err := ch.Next(c.buf)
		if err == io.EOF {
			return ids, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		id, err := c.put(chunk.Data)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
}

// put stores one chunk unless the store has it.
func (c *capture) put(data []byte) (string, error) {
	sum := sha256.Sum256(data)
	id := hex.EncodeToString(sum[:])
	p := c.s.chunkPath(id)
	if _, err := os.Stat(p); err == nil {
		return id, nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return "", fmt.Errorf("store chunk: %w", err)
	}
	z := c.s.enc.EncodeAll(data, nil)
	if err := writeFileNoSync(p, z); err != nil {
		return "", fmt.Errorf("store chunk: %w", err)
	}
	c.written = append(c.written, p)
	c.info.Stored += int64(len(z))
	return id, nil
}
