package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Materialize writes checkpoint id's trees into dirs, one directory per
// tree in the order the checkpoint was made from; none of dirs may exist.
// It is how a fork gets its disk: unlike Restore it swaps nothing and
// records nothing in the store (the store is another sandbox's, read
// only), so on failure it removes every directory it made, and a caller
// that dies midway leaves only dirs to remove (its own, not the store's).
//
// With owner set, every entry is given to owner and setuid (setgid but on
// directories) is cleared before anything is written, as ImportAs does:
// the files of one sandbox's identity never reach another's uid. Every
// chunk's hash is checked as it is written; the tree's shape is checked
// first (checkTree), so no write leaves a directory of dirs or goes
// through one of the checkpoint's own symlinks. It returns ErrUnknown for
// an unknown id, ErrInvalid for a number of dirs other than the
// checkpoint's trees, and ErrCorrupt for a missing or damaged chunk.
func (s *Store) Materialize(ctx context.Context, id string, dirs []string, owner *Owner) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(id); err != nil {
		return err
	}
	sn, err := s.readSnapshot(id)
	if err != nil {
		return err
	}
	if len(sn.Trees) != len(dirs) {
		return fmt.Errorf("materialize %s: %d directories, the checkpoint holds %d: %w", id, len(dirs), len(sn.Trees), ErrInvalid)
	}
	for _, d := range dirs {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("materialize %s: %s exists: %w", id, d, ErrInvalid)
		}
	}
	if owner != nil {
		owner.apply(&sn)
	}
	defer func() {
		if err != nil {
			for _, d := range dirs {
				os.RemoveAll(d)
			}
		}
	}()
	for i, d := range dirs {
		if err := s.materialize(ctx, sn.Trees[i], d); err != nil {
			return fmt.Errorf("materialize %s: %w", id, err)
		}
		crash("materialized")
		if err := syncfs(d); err != nil {
			return err
		}
	}
	return nil
}
