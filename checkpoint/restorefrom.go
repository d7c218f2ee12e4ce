package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// RestoreFrom is Restore with the files' bytes cloned (FICLONE: blocks
// shared, nothing copied) from from, one directory per tree: a read-only
// tree that holds exactly checkpoint id's (the pool snapshot it was
// captured from, which only root reaches and nothing changes). Staging,
// the recorded swap and the crash recovery are Restore's; directories,
// symlinks, modes, owners and times come from the checkpoint. A file
// that cannot be cloned (another file system, no reflinks, not a regular
// file of the recorded size) is written from its chunks, hash checked,
// as Restore does.
func (s *Store) RestoreFrom(ctx context.Context, id string, roots, from []string) error {
	if len(from) == 0 {
		return fmt.Errorf("restore %s: no tree to clone from: %w", id, ErrInvalid)
	}
	return s.restore(ctx, id, roots, from)
}

// placeFile writes regular file e at p: cloned from the same path under
// from when it can be, else from its chunks (writeFile).
func (s *Store) placeFile(p string, e entry, buf []byte, from string) error {
	if from != "" {
		err := cloneFile(filepath.Join(from, e.Path), p, e.Size)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errNoClone) {
			return err
		}
	}
	return s.writeFile(p, e, buf)
}

// errNoClone says a file could not be cloned and is to be written from
// its chunks; nothing was left at the destination.
var errNoClone = errors.New("cannot clone")

// cloneFile makes dst (which must not exist) a clone of src, a regular
// file of size bytes.
func cloneFile(src, dst string, size int64) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return errNoClone
	}
	defer in.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
		return errNoClone
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		out.Close()
		os.Remove(dst)
		return errNoClone
	}
	return out.Close()
}
