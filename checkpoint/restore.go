package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/restic/chunker"
	"golang.org/x/sys/unix"
)

// swap is restore.json: the directories a restore replaces.
type swap struct {
	// Phase is "stage" while the staging directories are written (a crash
	// rolls back: they are removed) and "swap" once they are complete (a
	// crash rolls forward: the swap is finished).
	Phase string     `json:"phase"`
	Dirs  []swapDirs `json:"dirs"`
}

type swapDirs struct {
	Target string `json:"target"` // the sandbox's directory
	Staged string `json:"staged"` // the checkpoint's tree, beside it
	Old    string `json:"old"`    // the target's old tree, while being removed
}

// Restore replaces each directory of roots (the same list, in the same
// order, as the checkpoint was made from) with checkpoint id's tree. It
// returns ErrUnknown for an unknown id and ErrCorrupt (with every target
// unchanged) when a chunk is missing or does not match its hash. The
// caller keeps the sandbox's processes off the directories meanwhile.
func (s *Store) Restore(ctx context.Context, id string, roots []string) error {
	return s.restore(ctx, id, roots, nil)
}

func (s *Store) restore(ctx context.Context, id string, roots, from []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(id); err != nil {
		return err
	}
	sn, err := s.readSnapshot(id)
	if err != nil {
		return err
	}
	if len(sn.Trees) != len(roots) || (from != nil && len(from) != len(roots)) {
		return fmt.Errorf("restore %s: %d directories, the checkpoint holds %d: %w", id, len(roots), len(sn.Trees), ErrInvalid)
	}
	sw := swap{Phase: "stage"}
	for _, r := range roots {
		r = filepath.Clean(r)
		dir, base := filepath.Split(r)
		sw.Dirs = append(sw.Dirs, swapDirs{Target: r,
			Staged: filepath.Join(dir, ".restore-"+base), Old: filepath.Join(dir, ".old-"+base)})
	}
	for _, d := range sw.Dirs {
		if err := removeAll(d.Staged, d.Old); err != nil {
			return err
		}
	}
	if err := s.writeSwap(sw); err != nil {
		return err
	}
	crash("staging")
	for i, d := range sw.Dirs {
		src := ""
		if from != nil {
			src = from[i]
		}
		if err = s.materializeFrom(ctx, sn.Trees[i], d.Staged, src); err != nil {
			break
		}
		if err = syncfs(d.Staged); err != nil {
			break
		}
	}
	if err != nil {
		for _, d := range sw.Dirs {
			os.RemoveAll(d.Staged)
		}
		os.Remove(s.path("restore.json"))
		return fmt.Errorf("restore %s: %w", id, err)
	}
	crash("staged")
	sw.Phase = "swap"
	if err := s.writeSwap(sw); err != nil {
		return err
	}
	return s.finishSwap(sw)
}

func removeAll(paths ...string) error {
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	return nil
}

func (s *Store) writeSwap(sw swap) error {
	b, err := json.Marshal(sw)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFileSync(s.path("restore.json"), b, 0o600); err != nil {
		return fmt.Errorf("record restore: %w", err)
	}
	return atomicfile.SyncDir(s.dir)
}

// finishSwap moves each target aside and its staging into place; every
// step is idempotent, so running it again after a crash anywhere in it
// ends in the same place.
func (s *Store) finishSwap(sw swap) error {
	for _, d := range sw.Dirs {
		if exists(d.Staged) {
			if exists(d.Target) && !exists(d.Old) {
				if err := os.Rename(d.Target, d.Old); err != nil {
					return fmt.Errorf("restore: move %s aside: %w", d.Target, err)
				}
				crash("aside")
			}
			if err := os.Rename(d.Staged, d.Target); err != nil {
				return fmt.Errorf("restore: move checkpoint into %s: %w", d.Target, err)
			}
			crash("swapped")
		}
		if err := atomicfile.SyncDir(filepath.Dir(d.Target)); err != nil {
			return err
		}
	}
	for _, d := range sw.Dirs {
		if err := removeAll(d.Old); err != nil {
			return err
		}
	}
	if err := os.Remove(s.path("restore.json")); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return atomicfile.SyncDir(s.dir)
}

// recoverRestore finishes a restore that was swapping when the process
// died, or removes the staging of one that was not yet.
func (s *Store) recoverRestore() error {
	b, err := os.ReadFile(s.path("restore.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("recover restore: %w", err)
	}
	var sw swap
	if err := json.Unmarshal(b, &sw); err != nil {
		return fmt.Errorf("recover restore: %w", err)
	}
	if sw.Phase == "swap" {
		return s.finishSwap(sw)
	}
	for _, d := range sw.Dirs {
		if err := removeAll(d.Staged); err != nil {
			return err
		}
	}
	return os.Remove(s.path("restore.json"))
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// materialize writes tree under dir (which must not exist), checking every
// chunk's hash. Directories and symlinks are made in order by the caller's
// goroutine, regular files written by one worker per core (each after its
// directory exists). Directory modes and times are set last, deepest
// first, so a read-only directory is filled before it becomes read-only.
// The tree is checked first (checkTree): a snapshot whose paths could lead
// a write through one of its own symlinks or out of dir is refused.
func (s *Store) materialize(ctx context.Context, tree []entry, dir string) error {
	return s.materializeFrom(ctx, tree, dir, "")
}

// materializeFrom is materialize with each regular file cloned from the
// same path under from (cloneFile) when from is not empty.
func (s *Store) materializeFrom(ctx context.Context, tree []entry, dir, from string) (err error) {
	if err := checkTree(tree); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	n := max(parallel(), 1)
	files := make(chan entry, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			buf := make([]byte, 0, chunker.MaxSize)
			for e := range files {
				if ctx.Err() != nil {
					continue // drained after a failure
				}
				p := filepath.Join(dir, e.Path)
				if err := s.placeFile(p, e, buf, from); err != nil {
					cancel(err)
				} else if err := setMeta(p, e); err != nil {
					cancel(err)
				}
			}
		})
	}
	var dirs []entry
	err = func() error {
		defer close(files)
		for _, e := range tree {
			if err := ctx.Err(); err != nil {
				return err
			}
			p := filepath.Join(dir, e.Path)
			switch {
			case e.Mode.IsDir():
				if err := os.Mkdir(p, 0o700); err != nil {
					return err
				}
				dirs = append(dirs, e)
				continue
			case e.Mode&fs.ModeSymlink != 0:
				if err := os.Symlink(e.Target, p); err != nil {
					return err
				}
			case e.Mode.IsRegular():
				select {
				case files <- e:
				case <-ctx.Done():
					return ctx.Err()
				}
				continue
			}
			if err := setMeta(p, e); err != nil {
				return err
			}
		}
		return nil
	}()
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil {
		return cause // a worker's failure (or the caller's cancel)
	}
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		p := filepath.Join(dir, dirs[i].Path)
		if err := setMeta(p, dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes regular file e at p from its chunks; buf (capacity
// chunker.MaxSize) is the caller's decoding buffer.
func (s *Store) writeFile(p string, e entry, buf []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	var n int64
	for _, id := range e.Chunks {
		data, err := s.chunk(id, buf)
		if err != nil {
			return fmt.Errorf("%s: %w", e.Path, err)
		}
		if _, err := f.Write(data); err != nil {
			return err
		}
		n += int64(len(data))
	}
	if n != e.Size {
		return fmt.Errorf("%s: %d bytes in its chunks, %d recorded: %w", e.Path, n, e.Size, ErrCorrupt)
	}
	return f.Close()
}

// chunk reads chunk id into buf (capacity chunker.MaxSize) and checks that
// its plain bytes hash to id.
func (s *Store) chunk(id string, buf []byte) ([]byte, error) {
	if !chunkRE.MatchString(id) {
		return nil, fmt.Errorf("chunk %q: %w", id, ErrCorrupt)
	}
	z, err := os.ReadFile(s.chunkPath(id))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w: %w", id, err, ErrCorrupt)
	}
	data, err := s.decode(id, z, buf)
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", id, err)
	}
	return data, nil
}

// decode decompresses frame z into buf (capacity chunker.MaxSize: a frame
// that decodes to more is refused) and checks the plain bytes hash to id.
func (s *Store) decode(id string, z, buf []byte) ([]byte, error) {
	data, err := s.dec.DecodeAll(z, buf[:0])
	if err != nil {
		return nil, fmt.Errorf("decompress: %w: %w", err, ErrCorrupt)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != id {
		return nil, fmt.Errorf("content does not match its hash: %w", ErrCorrupt)
	}
	return data, nil
}

func setMeta(p string, e entry) error {
	if err := os.Lchown(p, e.UID, e.GID); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if e.Mode&fs.ModeSymlink == 0 {
		if err := os.Chmod(p, e.Mode.Perm()|e.Mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.Mtime), unix.NsecToTimespec(e.Mtime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}
