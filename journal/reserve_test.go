package journal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/internal/testcap"
)

// TestFinishFullDisk: a journal whose file system its own output filled
// to the last byte (blocks), or whose inodes are all taken, still
// finishes: Finish frees the reserve it set aside at Create before it
// writes. The stored bytes stay readable, the exit record names them,
// and the reserve is gone afterwards (an ended journal holds none).
func TestFinishFullDisk(t *testing.T) {
	testcap.Root(t, "mounts a sized tmpfs to fill a journal's file system")
	for _, tt := range []struct{ name, opts string }{
		{"blocks", "size=2m"},
		{"inodes", "size=64m,nr_inodes=64"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mnt := t.TempDir()
			if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, tt.opts+",mode=0700"); err != nil {
				t.Fatalf("mount tmpfs: %v", err)
			}
			t.Cleanup(func() {
				if err := unix.Unmount(mnt, 0); err != nil {
					unix.Unmount(mnt, unix.MNT_DETACH)
				}
			})
			dir := filepath.Join(mnt, "j")
			w := mustCreate(t, dir, Options{Streams: []string{"stdout"}, SegmentBytes: 64 << 10})
			if !w.HasReserve() {
				t.Fatal("a new journal holds no reserve")
			}
			// Fill: output until the journal refuses it (a segment roll
			// needs an inode, the bytes need blocks), then take every
			// inode and block left with other files.
			var stored bytes.Buffer
			chunk := bytes.Repeat([]byte("0123456789abcdef"), 256)
			for {
				n, err := w.Write("stdout", chunk)
				stored.Write(chunk[:n])
				if err != nil {
					if !errors.Is(err, syscall.ENOSPC) {
						t.Fatalf("write: %v, want ENOSPC at the end", err)
					}
					break
				}
			}
			for i := 0; ; i++ {
				f, err := os.Create(filepath.Join(mnt, fmt.Sprint("filler", i)))
				if err != nil {
					break
				}
				n, _ := f.Write(make([]byte, 1<<20))
				f.Close()
				if n == 0 {
					break
				}
			}
			if err := w.Finish(Exit{Reason: ReasonSignaled, Signal: 9, Code: 137, Terminated: true}); err != nil {
				t.Fatalf("finish on a full file system: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, ReserveFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("reserve after Finish: stat err %v, want not exist", err)
			}
			j := mustOpen(t, dir)
			e, ok, err := j.Exit()
			if err != nil || !ok || e.Lengths["stdout"] != int64(stored.Len()) {
				t.Fatalf("exit: got %+v ok %v err %v, want stdout length %d", e, ok, err, stored.Len())
			}
			rd, err := j.NewReader("stdout", 0, false)
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			got, err := io.ReadAll(rd)
			if err != nil || !bytes.Equal(got, stored.Bytes()) {
				t.Fatalf("read back: %d bytes err %v, want the %d stored", len(got), err, stored.Len())
			}
		})
	}
}
