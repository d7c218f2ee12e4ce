package journal

// The reserve file: space a live journal holds so Finish can commit and
// publish exit.json on a full file system.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ReserveBytes is the space a live journal holds in its reserve file for
// Finish: the final index commit (a few bbolt pages) and exit.json, with
// room to spare. The reserve also holds the inode exit.json's temporary
// name takes. A journal that has no reserve (one recovered after a crash
// of its writer) finishes as well when there is space.
const ReserveBytes = 64 << 10

// reserveBytes is ReserveBytes; BenchmarkCreateFinish sets it to 0 for
// its baseline (a journal without a reserve).
var reserveBytes int64 = ReserveBytes

// allocReserve allocates dir's reserve file: blocks the file system
// really sets aside (fallocate, not a sparse file), so its removal frees
// them. A file system that cannot fallocate gets the bytes written.
func allocReserve(dir string) error {
	if reserveBytes == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, ReserveFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("allocate reserve: %w", err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, reserveBytes)
	if errors.Is(err, unix.EOPNOTSUPP) {
		_, err = f.Write(make([]byte, reserveBytes))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("allocate reserve: %w", err)
	}
	return nil
}

// HasReserve reports whether the journal still holds its reserve file
// (see ReserveBytes), which Finish frees before it writes.
func (w *Writer) HasReserve() bool {
	_, err := os.Lstat(filepath.Join(w.dir, ReserveFile))
	return err == nil
}

// releaseReserve gives dir's reserve to Finish: renamed to exit.json's
// temporary name, so the inode publishExit needs is already held (no one
// else can take it), and shrunk to one block, so the rest of its space is
// free for the final index commit. A journal without a reserve is left
// as it is.
func releaseReserve(dir string) {
	tmp := filepath.Join(dir, exitTmpName)
	if os.Rename(filepath.Join(dir, ReserveFile), tmp) == nil {
		os.Truncate(tmp, exitBlock)
	}
}

// exitBlock is what releaseReserve keeps of the reserve for exit.json.
const exitBlock = 4096
