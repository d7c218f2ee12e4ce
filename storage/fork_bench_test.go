package storage

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// A checkpoint and a fork as pool snapshots (issue #40), beside what they
// cost without them, on one workspace of many files. For the lead, on a
// quiet machine, as root (the figures are not taken by the test suite):
//
//	STORAGE_BENCH_BYTES=1073741824 STORAGE_BENCH_FILES=10000 \
//	  go test -run '^$' -bench 'WorkspaceOf' -benchtime 5x ./storage/
//
// BenchmarkWorkspaceOf10k has, each on the same tree in a btrfs volume:
//
//   - snapshot: syncfs of the volume, then a read-only snapshot (what a
//     checkpoint on btrfs costs once the sandbox is frozen: the freeze
//     spans exactly this);
//   - fork-clone: a writable clone of that snapshot as a new volume with
//     its own budget (Pool.Clone), what a fork's disk costs;
//   - fork-clone-chown: the clone, then every entry given to another
//     uid (lchown walk), as a fork between two sandboxes' identities must;
//   - cp-a: cp -a --reflink=never of the tree to another volume (a copy
//     of every byte: a fork where the driver has no snapshots);
//   - tar-zstd-1: tar | zstd -1 of the tree into a file on the pool (the
//     archive baseline of the figures).
//
// Unset, the tree is 64 MiB in 1000 files; STORAGE_BENCH_BYTES=1048576
// STORAGE_BENCH_FILES=10 with -benchtime 1x only proves they run.
func BenchmarkWorkspaceOf10k(b *testing.B) {
	needBench(b, Btrfs)
	size, files := int64(64*mib), 1000
	if v, err := strconv.ParseInt(os.Getenv("STORAGE_BENCH_BYTES"), 10, 64); err == nil && v > 0 {
		size = v
	}
	if v, err := strconv.Atoi(os.Getenv("STORAGE_BENCH_FILES")); err == nil && v > 0 {
		files = v
	}
	ctx := context.Background()
	p := benchPool(b, Btrfs, max(4<<30, 4*size))
	src, err := p.Create(ctx, "src", Limits{Bytes: 2 * size})
	if err != nil {
		b.Fatal(err)
	}
	fillTree(b, src.Path, size, files)
	dst, err := p.Create(ctx, "dst", Limits{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("snapshot", func(b *testing.B) {
		for i := range b.N {
			if err := syncfsOf(src.Path); err != nil {
				b.Fatal(err)
			}
			if err := p.Snapshot(ctx, "src", fmt.Sprint("ck", i)); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := p.DeleteSnapshot(ctx, fmt.Sprint("ck", i)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	if err := p.Snapshot(ctx, "src", "base"); err != nil {
		b.Fatal(err)
	}
	clone := func(b *testing.B, chown bool) {
		for i := range b.N {
			name := fmt.Sprint("fork", i)
			v, err := p.Clone(ctx, "base", name)
			if err != nil {
				b.Fatal(err)
			}
			if chown {
				if err := chownTree(v.Path, 4321, 4321); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := p.Delete(ctx, name); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.Run("fork-clone", func(b *testing.B) { clone(b, false) })
	b.Run("fork-clone-chown", func(b *testing.B) { clone(b, true) })
	b.Run("cp-a", func(b *testing.B) {
		for i := range b.N {
			to := filepath.Join(dst.Path, fmt.Sprint("copy", i))
			if out, err := exec.Command("cp", "-a", "--reflink=never", filepath.Join(src.Path, "."), to).CombinedOutput(); err != nil {
				b.Fatalf("cp -a: %v: %s", err, out)
			}
			if err := syncfsOf(to); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := os.RemoveAll(to); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("tar-zstd-1", func(b *testing.B) {
		if !haveTool("zstd") {
			b.Skip("no zstd binary")
		}
		for i := range b.N {
			out := filepath.Join(dst.Path, fmt.Sprint("tree", i, ".tar.zst"))
			if o, err := exec.Command("sh", "-c", `tar -C "$1" -cf - . | zstd -1 -q -o "$2"`, "sh", src.Path, out).CombinedOutput(); err != nil {
				b.Fatalf("tar | zstd: %v: %s", err, o)
			}
			b.StopTimer()
			if fi, err := os.Stat(out); err == nil {
				b.ReportMetric(float64(fi.Size()), "archive-bytes")
			}
			os.Remove(out)
			b.StartTimer()
		}
	})
}

// fillTree writes files files of size/files bytes each under dir, in 100
// directories, half random and half text (about 2x compressible, as the
// checkpoint package's bench tree), and syncs them.
func fillTree(b *testing.B, dir string, size int64, files int) {
	b.Helper()
	per := int(size / int64(files))
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, per)
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%100), fmt.Sprintf("f%05d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		for j := 0; j < per/2; j++ {
			buf[j] = byte(r.Uint32())
		}
		for j := per / 2; j < per; j++ {
			buf[j] = "the quick brown fox jumps over the lazy dog\n"[j%44]
		}
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := syncfsOf(dir); err != nil {
		b.Fatal(err)
	}
}

func syncfsOf(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// chownTree gives every entry under root to uid:gid without following a
// symlink.
func chownTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
