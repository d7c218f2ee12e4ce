package checkpoint_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/storage"
)

// TestRestoreFrom, where the file system has no reflinks (every file
// falls back to its chunks), and on a btrfs volume (files cloned): a
// restore that clones from a copy of the tree the checkpoint was made
// from gives the checkpoint's tree exactly; a file of the clone source
// whose size is not the checkpoint's is written from its chunks, never
// taken as it is; no source is ErrInvalid.
func TestRestoreFrom(t *testing.T) {
	t.Run("no reflinks", func(t *testing.T) { testRestoreFrom(t, t.TempDir()) })
	t.Run("btrfs", func(t *testing.T) {
		if os.Geteuid() != 0 {
			testcap.Skip(t, "root", "a btrfs pool mounts a loop device")
		}
		if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
			testcap.Skip(t, "mkfs.btrfs", "the btrfs pool runs it")
		}
		ctx := context.Background()
		dir := filepath.Join(t.TempDir(), "pool")
		p, err := storage.Open(ctx, storage.Config{Dir: dir, Driver: storage.Btrfs, Size: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Destroy(context.Background()) })
		v, err := p.Create(ctx, "v", storage.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		testRestoreFrom(t, v.Path)
	})
}

func testRestoreFrom(t *testing.T, base string) {
	ctx := context.Background()
	ws := filepath.Join(base, "ws")
	sample(t, ws)
	s := open(t, filepath.Join(base, "store"))
	info, err := s.Create(ctx, []string{ws}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := listing(t, ws)
	snap := filepath.Join(base, "snap")
	if out, err := exec.Command("cp", "-a", "--reflink=auto", ws, snap).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	// The source lies about one file: a different size must not be used.
	if err := os.WriteFile(filepath.Join(snap, "a.txt"), []byte("a longer lie"), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(ws, "a.txt"), []byte("changed"), 0o644)
	if err := s.RestoreFrom(ctx, info.ID, []string{ws}, []string{snap}); err != nil {
		t.Fatal(err)
	}
	if got := listing(t, ws); !slices.Equal(got, want) {
		t.Errorf("after RestoreFrom:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := s.RestoreFrom(ctx, info.ID, []string{ws}, nil); !errors.Is(err, checkpoint.ErrInvalid) {
		t.Errorf("RestoreFrom with no source = %v, want ErrInvalid", err)
	}
}
