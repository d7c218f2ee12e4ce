package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// The reserve: space on the registry's file system set aside (a file of
// allocated blocks beside registry.db) for the commits that must land on a
// full disk. bbolt grows its file sparsely and writes every commit's pages
// anew (copy on write), so on a full file system even a delete can fail
// with ENOSPC. The commits that record an end or remove something
// (urgent: updates and deletes, never creates) release the reserve and
// retry once when they fail so; what they free then lets
// ReplenishReserve set it aside again.

// DefaultReserveBytes is the reserve's size when SetReserve is given 0:
// far more than the largest urgent commit (a destroy of a sandbox with
// thousands of session records rewrites a few hundred pages), little
// beside a state file system.
const DefaultReserveBytes = 8 << 20

// replenishFactor: the reserve is set aside again only when the file
// system has this many times its size free, so that it is not taken back
// from a disk that is still nearly full.
const replenishFactor = 4

// reserve is the registry's reserve file. mu guards it; path "" means none.
type reserve struct {
	mu   sync.Mutex
	path string
	size int64
}

// SetReserve sets aside size bytes (DefaultReserveBytes when 0) in a file
// at path for urgent commits, now if the file system has room
// (ReplenishReserve), else once it has. A file left at path by an earlier
// runnerd is reused.
func (r *Registry) SetReserve(path string, size int64) error {
	if size <= 0 {
		size = DefaultReserveBytes
	}
	r.res.mu.Lock()
	r.res.path, r.res.size = path, size
	r.res.mu.Unlock()
	_, err := r.ReplenishReserve()
	return err
}

// HasReserve reports whether the reserve is set aside now.
func (r *Registry) HasReserve() bool {
	r.res.mu.Lock()
	defer r.res.mu.Unlock()
	if r.res.path == "" {
		return false
	}
	fi, err := os.Stat(r.res.path)
	return err == nil && fi.Size() >= r.res.size
}

// ReplenishReserve sets the reserve aside again if it was released and
// the file system has replenishFactor times its size free. It reports
// whether the reserve is held now; no room is not an error.
func (r *Registry) ReplenishReserve() (bool, error) {
	r.res.mu.Lock()
	defer r.res.mu.Unlock()
	if r.res.path == "" {
		return false, nil
	}
	if fi, err := os.Stat(r.res.path); err == nil && fi.Size() >= r.res.size {
		return true, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(r.res.path), &st); err != nil {
		return false, fmt.Errorf("replenish registry reserve: %w", err)
	}
	if st.Bavail*uint64(st.Bsize) < replenishFactor*uint64(r.res.size) || (st.Files > 0 && st.Ffree < 2) {
		return false, nil
	}
	f, err := os.OpenFile(r.res.path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return false, fmt.Errorf("replenish registry reserve: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, r.res.size)
	if errors.Is(err, unix.EOPNOTSUPP) {
		_, err = f.WriteAt(make([]byte, r.res.size), 0)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(r.res.path)
		if noSpace(err) {
			return false, nil
		}
		return false, fmt.Errorf("replenish registry reserve: %w", err)
	}
	return true, nil
}

// releaseReserve removes the reserve file and reports whether it freed
// anything.
func (r *Registry) releaseReserve() bool {
	r.res.mu.Lock()
	defer r.res.mu.Unlock()
	return r.res.path != "" && os.Remove(r.res.path) == nil
}

// urgent is db.Update for a commit that must land on a full disk: when
// the file system refuses its pages, it releases the reserve and tries
// once more.
func (r *Registry) urgent(fn func(*bolt.Tx) error) error {
	err := r.db.Update(fn)
	if noSpace(err) && r.releaseReserve() {
		err = r.db.Update(fn)
	}
	return err
}

// noSpace reports whether err is a file system out of blocks, inodes or
// quota.
func noSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)
}
