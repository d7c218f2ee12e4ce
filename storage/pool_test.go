package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUsage: Usage counts what was written (bytes; inodes on ext4) within
// what each file system adds of its own.
func TestUsage(t *testing.T) {
	for _, driver := range budgetDrivers {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			p := openPool(t, driver, 256*mib)
			v, err := p.Create(ctx, "u", Limits{Bytes: 64 * mib})
			if err != nil {
				t.Fatal(err)
			}
			before, err := p.Usage(ctx, "u")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fill(filepath.Join(v.Path, "big"), 10*mib); err != nil {
				t.Fatal(err)
			}
			for i := range 100 {
				if err := os.WriteFile(filepath.Join(v.Path, fmt.Sprintf("small%d", i)), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			syncfs(t, v.Path)
			after, err := p.Usage(ctx, "u")
			if err != nil {
				t.Fatal(err)
			}
			grew := after.Bytes - before.Bytes
			if grew < 10*mib || grew > 12*mib {
				t.Errorf("usage grew %d bytes for 10 MiB and 100 one-byte files, want 10-12 MiB (before %+v, after %+v)", grew, before, after)
			}
			switch driver {
			case Btrfs:
				if after.Inodes != -1 {
					t.Errorf("btrfs inodes: got %d, want -1 (not counted)", after.Inodes)
				}
			case Ext4:
				if d := after.Inodes - before.Inodes; d != 101 {
					t.Errorf("ext4 inodes grew %d, want 101", d)
				}
			}
		})
	}
}

func syncfs(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteFreesAll: Delete unmounts, frees the loop device and the
// files (ext4), gives the pool its space back (btrfs), and a second
// Delete of the same name succeeds.
func TestDeleteFreesAll(t *testing.T) {
	for _, driver := range budgetDrivers {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			p := openPool(t, driver, 256*mib)
			used := func() int64 {
				t.Helper()
				if driver != Btrfs {
					return 0
				}
				mnt := filepath.Join(p.dir, "mnt")
				syncfs(t, mnt)
				var st unix.Statfs_t
				if err := unix.Statfs(mnt, &st); err != nil {
					t.Fatal(err)
				}
				return int64(st.Blocks-st.Bfree) * st.Bsize
			}
			base := used()
			loopsBefore := len(loopsUnder(t, p.dir))
			v, err := p.Create(ctx, "d", Limits{Bytes: 64 * mib})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fill(filepath.Join(v.Path, "f"), 40*mib); err != nil {
				t.Fatal(err)
			}
			if driver == Btrfs && used()-base < 40*mib {
				t.Fatalf("pool used %d bytes more after 40 MiB written", used()-base)
			}
			if err := p.Delete(ctx, "d"); err != nil {
				t.Fatal(err)
			}
			if grown := used() - base; grown > 2*mib {
				t.Errorf("pool still uses %d bytes more after Delete", grown)
			}
			if _, ok, _ := mountAt(v.Path); ok {
				t.Errorf("%s still mounted after Delete", v.Path)
			}
			if _, err := os.Lstat(v.Path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("volume path after Delete: %v, want absent", err)
			}
			if driver == Ext4 {
				if _, err := os.Lstat(filepath.Join(p.dir, "images", "d.img")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("image after Delete: %v, want absent", err)
				}
			}
			if n := len(loopsSettle(t, p.dir, loopsBefore)); n != loopsBefore {
				t.Errorf("loop devices on the pool's files: %d after Delete, %d before Create", n, loopsBefore)
			}
			if err := p.Delete(ctx, "d"); err != nil {
				t.Errorf("Delete of an absent volume: %v, want success", err)
			}
			if _, err := p.Usage(ctx, "d"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Usage after Delete: %v, want ErrNotFound", err)
			}
		})
	}
}

// TestAdoption: Open again on the same directory, after Close (runnerd
// restarted) and after everything was unmounted (the host rebooted),
// finds the volumes with their data and limits, and attaches no loop
// device it did not need.
func TestAdoption(t *testing.T) {
	for _, driver := range budgetDrivers {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			p := openPool(t, driver, 256*mib)
			dir := p.dir
			cfg := Config{Dir: dir, Driver: driver, Size: 256 * mib}
			v, err := p.Create(ctx, "a", Limits{Bytes: 32 * mib})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(v.Path, "keep"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			loops := len(loopsUnder(t, dir))
			check := func(t *testing.T, q *Pool, wantLoops int) {
				t.Helper()
				for range 3 { // Open/Close cycles leak nothing
					if err := q.Close(); err != nil {
						t.Fatal(err)
					}
					if q, err = Open(ctx, cfg); err != nil {
						t.Fatal(err)
					}
				}
				if n := countMounts(t, dir); n != 1 {
					t.Errorf("mounts on the pool directory after reopening: %d, want its one shared bind", n)
				}
				if got := len(loopsSettle(t, dir, wantLoops)); got != wantLoops {
					t.Errorf("loop devices after reopening: %d, want %d", got, wantLoops)
				}
				b, err := os.ReadFile(filepath.Join(q.Path("a"), "keep"))
				if err != nil || string(b) != "kept" {
					t.Errorf("file after reopening: %q, %v", b, err)
				}
				again, err := q.Create(ctx, "a", Limits{Bytes: 32 * mib})
				if err != nil || again.Limits.Bytes != 32*mib {
					t.Errorf("Create of the adopted volume (get): %+v, %v", again, err)
				}
				if _, err := q.Create(ctx, "a", Limits{Bytes: 48 * mib}); !errors.Is(err, ErrInvalid) {
					t.Errorf("Create of the adopted volume with other limits: %v, want ErrInvalid", err)
				}
				if n, err := fill(filepath.Join(q.Path("a"), "f"), 64*mib); !isBudgetErr(err) || n > 32*mib {
					t.Errorf("budget after reopening: %d bytes written, %v", n, err)
				}
				os.Remove(filepath.Join(q.Path("a"), "f"))
				p = q // the cleanup destroys the last one
			}
			t.Run("restart", func(t *testing.T) { check(t, p, loops) })
			t.Run("through a symlink", func(t *testing.T) {
				link := filepath.Join(t.TempDir(), "link")
				if err := os.Symlink(dir, link); err != nil {
					t.Fatal(err)
				}
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
				q, err := Open(ctx, Config{Dir: link, Driver: driver, Size: 256 * mib})
				if err != nil {
					t.Fatalf("Open through a symlink: %v", err)
				}
				if got := q.Path("a"); got != v.Path {
					t.Errorf("Path through a symlink: %s, want %s", got, v.Path)
				}
				p = q
			})
			t.Run("reboot", func(t *testing.T) {
				// What a reboot leaves: the files, no mounts, no devices.
				unmount(v.Path)
				unmount(filepath.Join(dir, "mnt"))
				if err := unsharePoolDir(dir); err != nil {
					t.Fatal(err)
				}
				if n := len(loopsSettle(t, dir, 0)); n != 0 {
					t.Fatalf("loop devices after unmounting everything: %d", n)
				}
				check(t, p, loops)
			})
		})
	}
}

// TestCrashMidCreate: a Create that crashed after writing its record,
// with the driver's volume half made, and a Delete that crashed after
// removing the record, are both finished by Open (removed), and the
// name can be created again.
func TestCrashMidCreate(t *testing.T) {
	for _, driver := range []string{Btrfs, Ext4, Dir} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			p := openPool(t, driver, 256*mib)
			l := Limits{Bytes: 32 * mib}
			if driver == Dir {
				l = Limits{}
			}
			// The half-made volume: record "creating", driver volume made.
			if err := p.writeRecord("vol", "half", record{State: stateCreating, Limits: l}); err != nil {
				t.Fatal(err)
			}
			if _, err := p.drv.create(ctx, "half", l); err != nil {
				t.Fatal(err)
			}
			// The half-deleted one: driver volume, no record.
			if _, err := p.drv.create(ctx, "orphan", l); err != nil {
				t.Fatal(err)
			}
			// A record whose driver volume never came.
			if err := p.writeRecord("vol", "ghost", record{State: stateCreating, Limits: l}); err != nil {
				t.Fatal(err)
			}
			if driver == Btrfs {
				// A snapshot cut short the same way.
				if _, err := p.Create(ctx, "src", l); err != nil {
					t.Fatal(err)
				}
				if err := p.writeRecord("snap", "halfsnap", record{State: stateCreating, Limits: l, From: "src"}); err != nil {
					t.Fatal(err)
				}
				if err := p.drv.snapshot(ctx, "src", "halfsnap"); err != nil {
					t.Fatal(err)
				}
				if err := p.Delete(ctx, "src"); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			q, err := Open(ctx, Config{Dir: p.dir, Driver: driver, Size: 256 * mib})
			if err != nil {
				t.Fatalf("Open after the crash: %v", err)
			}
			t.Cleanup(func() { q.Destroy(ctx) })
			vols, snaps, err := q.drv.list()
			if err != nil || len(vols) != 0 || len(snaps) != 0 {
				t.Errorf("driver volumes and snapshots after Open: %v %v, %v; want none", vols, snaps, err)
			}
			ents, _ := os.ReadDir(filepath.Join(q.dir, "records"))
			if len(ents) != 0 {
				t.Errorf("records after Open: %d, want none", len(ents))
			}
			if _, err := q.Usage(ctx, "half"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Usage of the half-made volume: %v, want ErrNotFound", err)
			}
			if _, err := q.Create(ctx, "half", l); err != nil {
				t.Errorf("Create after the crash: %v", err)
			}
			// The same crash met by Create itself (no Open between).
			if err := q.writeRecord("vol", "half2", record{State: stateCreating, Limits: l}); err != nil {
				t.Fatal(err)
			}
			if _, err := q.drv.create(ctx, "half2", l); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(q.Path("half2"), "stale"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			v, err := q.Create(ctx, "half2", l)
			if err != nil {
				t.Fatalf("Create over a half-made volume: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(v.Path, "stale")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the half-made volume's file survived Create: %v", err)
			}
		})
	}
}

// TestBtrfsPoolGrows: opening a btrfs pool with a larger size grows the
// pool file and its file system, mounted; a smaller size leaves it.
func TestBtrfsPoolGrows(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Btrfs, 256*mib)
	total := func() int64 {
		t.Helper()
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Join(p.dir, "mnt"), &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Blocks) * st.Bsize
	}
	before := total()
	for _, tc := range []struct {
		size    int64
		atLeast int64
	}{{512 * mib, before + 200*mib}, {256 * mib, before + 200*mib}} {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		q, err := Open(ctx, Config{Dir: p.dir, Driver: Btrfs, Size: tc.size})
		if err != nil {
			t.Fatalf("Open with %d bytes: %v", tc.size, err)
		}
		p = q
		if got := total(); got < tc.atLeast || got > 512*mib {
			t.Errorf("after Open with %d MiB: file system of %d bytes, want %d-%d (it was %d)", tc.size/mib, got, tc.atLeast, 512*mib, before)
		}
	}
	t.Cleanup(func() { p.Destroy(ctx) })
}

// countMounts counts the mounts at point in this mount namespace.
func countMounts(t *testing.T, point string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == point {
			n++
		}
	}
	return n
}
