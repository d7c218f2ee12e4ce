// Package atomicfile publishes small files so that a reader sees the old
// content or the new, never a part, and makes directory entries durable.
//
// Invariants: WriteFile never leaves a partial file at the target path
// (it writes PATH.tmp and renames it over PATH; on failure PATH.tmp is
// removed); it does not fsync, so a caller that needs the content to
// survive a power loss calls WriteFileSync, and SyncDir on the directory
// for the rename itself.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
)

// WriteFile writes b to path through PATH.tmp and a rename. It does not
// fsync: for files that matter only while the processes that read them
// exist (a power loss ends those too).
func WriteFile(path string, b []byte, perm fs.FileMode) error {
	return write(path, b, perm, false)
}

// WriteFileSync is WriteFile with the content fsynced before the rename,
// so after a crash path holds the old content or the new. The rename is
// durable once the caller syncs the directory (SyncDir).
func WriteFileSync(path string, b []byte, perm fs.FileMode) error {
	return write(path, b, perm, true)
}

func write(path string, b []byte, perm fs.FileMode, sync bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// SyncDir fsyncs the directory dir, making the entries created, renamed
// or removed in it durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
