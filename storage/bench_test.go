package storage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
)

// The pool's costs, for the lead to measure on a quiet machine (root;
// go test -run '^$' -bench . -benchtime 20x -count 5 ./storage/):
//
//   - BenchmarkPoolCreate: a btrfs pool made from nothing (pool file,
//     mkfs.btrfs, loop device, mount, quota enable) and destroyed;
//   - BenchmarkVolumeCreate: a volume made and deleted in an open pool,
//     per driver (btrfs: subvolume + qgroup limit; ext4: image, mkfs,
//     loop device, mount);
//   - BenchmarkSnapshot1GiB: a read-only snapshot of a volume holding
//     1 GiB in 64 files, beside BenchmarkCopy1GiB, `cp -a` of the same
//     tree on the same file system: what a checkpoint or a fork costs
//     with and without the driver's snapshots.
//
// They are not run by the test suite (a benchmark runs only with -bench).

func BenchmarkPoolCreate(b *testing.B) {
	needBench(b, Btrfs)
	ctx := context.Background()
	base := b.TempDir()
	for i := range b.N {
		p, err := Open(ctx, Config{Dir: filepath.Join(base, fmt.Sprint(i)), Driver: Btrfs, Size: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.Destroy(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkVolumeCreate(b *testing.B) {
	for _, driver := range []string{Btrfs, Ext4, Dir} {
		b.Run(driver, func(b *testing.B) {
			needBench(b, driver)
			ctx := context.Background()
			p := benchPool(b, driver, 1<<30)
			l := Limits{Bytes: 256 * mib}
			if driver == Dir {
				l = Limits{}
			}
			for i := range b.N {
				name := fmt.Sprint("v", i)
				if _, err := p.Create(ctx, name, l); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := p.Delete(ctx, name); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// fill1GiB writes 64 files of 16 MiB into dir and syncs them.
func fill1GiB(b *testing.B, dir string) {
	b.Helper()
	for i := range 64 {
		if _, err := fill(filepath.Join(dir, fmt.Sprint("f", i)), 16*mib); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSnapshot1GiB(b *testing.B) {
	needBench(b, Btrfs)
	ctx := context.Background()
	p := benchPool(b, Btrfs, 4<<30)
	v, err := p.Create(ctx, "src", Limits{Bytes: 2 << 30})
	if err != nil {
		b.Fatal(err)
	}
	fill1GiB(b, v.Path)
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprint("s", i)
		if err := p.Snapshot(ctx, "src", name); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.DeleteSnapshot(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkCopy1GiB(b *testing.B) {
	needBench(b, Btrfs)
	ctx := context.Background()
	p := benchPool(b, Btrfs, 4<<30)
	v, err := p.Create(ctx, "src", Limits{})
	if err != nil {
		b.Fatal(err)
	}
	fill1GiB(b, v.Path)
	// The copies go to a second volume of the same pool: a copy into the
	// tree being copied would copy itself.
	to, err := p.Create(ctx, "dst", Limits{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		dst := filepath.Join(to.Path, fmt.Sprint("copy", i))
		// --reflink=never: a copy of the bytes, what a driver without
		// snapshots (or a copy across file systems) pays.
		if out, err := exec.Command("cp", "-a", "--reflink=never", filepath.Join(v.Path, "."), dst).CombinedOutput(); err != nil {
			b.Fatalf("cp -a: %v: %s", err, out)
		}
		b.StopTimer()
		if err := os.RemoveAll(dst); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func needBench(b *testing.B, driver string) {
	b.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(b, "root", "the pool mounts file systems")
	}
	if tool := map[string]string{Btrfs: "mkfs.btrfs", Ext4: "mkfs.ext4"}[driver]; tool != "" && !haveTool(tool) {
		testcap.Skip(b, tool, "the "+driver+" driver runs it")
	}
}

func benchPool(b *testing.B, driver string, size int64) *Pool {
	b.Helper()
	p, err := Open(context.Background(), Config{Dir: filepath.Join(b.TempDir(), "pool"), Driver: driver, Size: size})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := p.Destroy(context.Background()); err != nil {
			b.Error(err)
		}
	})
	return p
}
