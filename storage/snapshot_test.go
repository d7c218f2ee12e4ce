package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
	"golang.org/x/sys/unix"
)

// TestSnapshotClone (btrfs): a snapshot is read-only and keeps the
// volume's data as it was; a clone of it starts with that data, shares
// its blocks (the pool's used space barely moves), has the volume's
// budget, and neither sees the other's writes.
func TestSnapshotClone(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Btrfs, 256*mib)
	v, err := p.Create(ctx, "src", Limits{Bytes: 48 * mib})
	if err != nil {
		t.Fatal(err)
	}
	write := func(dir, name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(dir, name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return "<absent>"
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write(v.Path, "f", "one")
	if _, err := fill(filepath.Join(v.Path, "data"), 30*mib); err != nil {
		t.Fatal(err)
	}
	poolUsed := func() int64 {
		mnt := filepath.Join(p.dir, "mnt")
		syncfs(t, mnt)
		var st unix.Statfs_t
		if err := unix.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	before := poolUsed()
	if err := p.Snapshot(ctx, "src", "snap"); err != nil {
		t.Fatal(err)
	}
	if err := p.Snapshot(ctx, "src", "snap"); !errors.Is(err, ErrExists) {
		t.Errorf("second Snapshot of the same name: %v, want ErrExists", err)
	}
	c, err := p.Clone(ctx, "snap", "fork")
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.Bytes != 48*mib {
		t.Errorf("clone's limits: %+v, want the source's 48 MiB", c.Limits)
	}
	if grew := poolUsed() - before; grew > 2*mib {
		t.Errorf("a snapshot and a clone of 30 MiB took %d bytes of the pool, want the blocks shared", grew)
	}
	snapDir := filepath.Join(p.dir, "mnt", "snapshots", "snap")
	if err := os.WriteFile(filepath.Join(snapDir, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the snapshot: %v, want EROFS", err)
	}
	if got := read(c.Path, "f"); got != "one" {
		t.Errorf("clone's f: %q, want %q", got, "one")
	}
	write(v.Path, "f", "two")
	write(c.Path, "g", "fork only")
	if got := read(c.Path, "f"); got != "one" {
		t.Errorf("clone's f after the source wrote: %q, want %q", got, "one")
	}
	if got := read(v.Path, "g"); got != "<absent>" {
		t.Errorf("source's g after the clone wrote: %q, want absent", got)
	}
	if got := read(snapDir, "f"); got != "one" {
		t.Errorf("snapshot's f after the source wrote: %q, want %q", got, "one")
	}
	// The clone's budget is its own: it counts the shared 30 MiB and
	// stops at 48.
	if n, err := fill(filepath.Join(c.Path, "more"), 48*mib); !isBudgetErr(err) || n > 18*mib {
		t.Errorf("write 48 MiB into the clone of a 30 MiB volume with a 48 MiB budget: %d bytes, %v; want at most 18 MiB, then EDQUOT", n, err)
	}
	if _, err := p.Clone(ctx, "snap", "fork"); !errors.Is(err, ErrExists) {
		t.Errorf("Clone onto an existing volume: %v, want ErrExists", err)
	}
	if _, err := p.Clone(ctx, "nosnap", "other"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Clone of an absent snapshot: %v, want ErrNotFound", err)
	}
	if err := p.DeleteSnapshot(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
	if got := read(c.Path, "f"); got != "one" {
		t.Errorf("clone's f after its snapshot was deleted: %q", got)
	}
	if err := p.DeleteSnapshot(ctx, "snap"); err != nil {
		t.Errorf("DeleteSnapshot of an absent snapshot: %v, want success", err)
	}
}

// TestNoSnapshots: ext4 and dir have no snapshots, and say so with
// ErrNotSupported, leaving nothing behind.
func TestNoSnapshots(t *testing.T) {
	for _, driver := range []string{Ext4, Dir} {
		t.Run(driver, func(t *testing.T) {
			ctx := context.Background()
			p := openPool(t, driver, 0)
			l := Limits{Bytes: 16 * mib}
			if driver == Dir {
				l = Limits{}
			}
			if _, err := p.Create(ctx, "v", l); err != nil {
				t.Fatal(err)
			}
			if err := p.Snapshot(ctx, "v", "s"); !errors.Is(err, ErrNotSupported) {
				t.Errorf("Snapshot: %v, want ErrNotSupported", err)
			}
			if _, err := p.Clone(ctx, "s", "c"); !errors.Is(err, ErrNotFound) {
				t.Errorf("Clone of the snapshot never made: %v, want ErrNotFound", err)
			}
			if ents, _ := os.ReadDir(filepath.Join(p.dir, "records")); len(ents) != 1 {
				t.Errorf("records after the refused Snapshot: %d, want 1 (the volume's)", len(ents))
			}
		})
	}
}

// TestExt4InodeLimit: an ext4 volume made for 1000 inodes holds about
// that many (mkfs rounds up to whole inode-table blocks; Create says how
// many), and creating files past them fails with ENOSPC while bytes are
// left.
func TestExt4InodeLimit(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Ext4, 0)
	v, err := p.Create(ctx, "i", Limits{Bytes: 64 * mib, Inodes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if v.Limits.Inodes < 1000 || v.Limits.Inodes > 1100 {
		t.Fatalf("held inodes: %d, want 1000-1100", v.Limits.Inodes)
	}
	u, err := p.Usage(ctx, "i")
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	var ferr error
	for i := range 2000 {
		f, err := os.Create(filepath.Join(v.Path, fmt.Sprintf("f%d", i)))
		if err != nil {
			ferr = err
			break
		}
		f.Close()
		made++
	}
	if !errors.Is(ferr, unix.ENOSPC) {
		t.Fatalf("creating 2000 files under a %d-inode limit: %d made, then %v; want ENOSPC", v.Limits.Inodes, made, ferr)
	}
	if want := v.Limits.Inodes - u.Inodes; int64(made) != want {
		t.Errorf("files made: %d, want the %d inodes left (%d held, %d used)", made, want, v.Limits.Inodes, u.Inodes)
	}
	if n, err := fill(filepath.Join(v.Path, "f0"), 4*mib); err != nil {
		t.Errorf("bytes are left: writing 4 MiB into an existing file: %d, %v", n, err)
	}
	if _, err := p.Grow(ctx, "i", Limits{Bytes: 64 * mib, Inodes: 100000}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Grow to 100000 inodes at the same size: %v, want ErrNotSupported", err)
	}
	if _, err := p.Grow(ctx, "i", Limits{Bytes: 64 * mib, Inodes: 500}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Grow to fewer inodes: %v, want ErrInvalid", err)
	}
}

// TestDirDriver: the dir driver holds no budget and says so: Budgets is
// false, any limit is ErrNotSupported with nothing made, usage is not
// counted; volumes are made and deleted.
func TestDirDriver(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Dir, 0)
	if p.Budgets() || p.Driver() != Dir {
		t.Errorf("Budgets %v, Driver %q; want false, dir", p.Budgets(), p.Driver())
	}
	for _, l := range []Limits{{Bytes: mib}, {Inodes: 10}} {
		if _, err := p.Create(ctx, "v", l); !errors.Is(err, ErrNotSupported) {
			t.Errorf("Create with %+v: %v, want ErrNotSupported", l, err)
		}
	}
	if _, err := os.Lstat(p.Path("v")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume after a refused Create: %v, want absent", err)
	}
	v, err := p.Create(ctx, "v", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(v.Path, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A symlink out of the volume: Delete removes the link, not its target.
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(v.Path, "a", "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Usage(ctx, "v"); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Usage: %v, want ErrNotSupported", err)
	}
	if _, err := p.Grow(ctx, "v", Limits{Bytes: mib}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Grow: %v, want ErrNotSupported", err)
	}
	if err := p.Delete(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(v.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume after Delete: %v", err)
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "host" {
		t.Errorf("the symlink's target after Delete: %q, %v", b, err)
	}
}

// TestBadInput: names and limits are checked before anything is made;
// btrfs refuses an inode limit it could not hold; a pool made by one
// driver is refused by another.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Btrfs, 256*mib)
	for _, name := range []string{"", "..", "a/b", "A", "-x", ".x", "a..b", string(make([]byte, 70))} {
		if _, err := p.Create(ctx, name, Limits{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Create %q: %v, want ErrInvalid", name, err)
		}
	}
	if _, err := p.Create(ctx, "v", Limits{Bytes: -1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative bytes: %v, want ErrInvalid", err)
	}
	if _, err := p.Create(ctx, "v", Limits{Bytes: 16 * mib, Inodes: 1000}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("btrfs inode limit: %v, want ErrNotSupported", err)
	}
	if _, err := p.Grow(ctx, "absent", Limits{Bytes: mib}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Grow of an absent volume: %v, want ErrNotFound", err)
	}
	vols, _, _ := p.drv.list()
	if ents, _ := os.ReadDir(filepath.Join(p.dir, "records")); len(vols) != 0 || len(ents) != 0 {
		t.Errorf("after refused calls: volumes %v, %d records; want none", vols, len(ents))
	}
	if _, err := Open(ctx, Config{Dir: p.dir, Driver: Ext4}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Open of a btrfs pool as ext4: %v, want ErrInvalid", err)
	}
	small := filepath.Join(t.TempDir(), "small")
	if _, err := Open(ctx, Config{Dir: small, Driver: Btrfs, Size: 64 * mib}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Open of a 64 MiB btrfs pool: %v, want ErrInvalid", err)
	}
	if _, err := os.Lstat(small); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused pool's directory: %v, want absent", err)
	}
	if _, err := Open(ctx, Config{Dir: "relative", Driver: Dir}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Open of a relative directory: %v, want ErrInvalid", err)
	}
	if _, err := Open(ctx, Config{Dir: t.TempDir(), Driver: "zfs"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Open with an unknown driver: %v, want ErrInvalid", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, "v", Limits{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Create after Close: %v, want ErrClosed", err)
	}
}

// TestDefaultDriver: on this host (the tests' tools present) the default
// is btrfs, with a reason.
func TestDefaultDriver(t *testing.T) {
	needDriver(t, Btrfs)
	if name, why := DefaultDriver(); name != Btrfs || why == "" {
		t.Errorf("DefaultDriver: %q (%s), want btrfs with a reason", name, why)
	}
}

// TestDefaultDriverFallback: without btrfs-progs the default falls back
// to ext4 and says what btrfs lacked; without e2fsprogs too, to dir,
// which says budgets are off.
func TestDefaultDriverFallback(t *testing.T) {
	if _, err := os.Stat("/dev/loop-control"); err != nil || !kernelHas("ext4") {
		testcap.Skip(t, "loop", "the fallback to ext4 needs loop devices and ext4")
	}
	saved := toolDirs
	t.Cleanup(func() { toolDirs = saved })
	bin := t.TempDir()
	toolDirs = []string{bin}
	for _, tool := range []string{"mkfs.ext4", "resize2fs"} {
		if err := os.WriteFile(filepath.Join(bin, tool), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	name, why := DefaultDriver()
	if name != Ext4 || !strings.Contains(why, "mkfs.btrfs") || !strings.Contains(why, "btrfs-progs") {
		t.Errorf("without btrfs-progs: %q (%s), want ext4 naming mkfs.btrfs and btrfs-progs", name, why)
	}
	toolDirs = []string{t.TempDir()}
	name, why = DefaultDriver()
	if name != Dir || !strings.Contains(why, "no disk budgets") || !strings.Contains(why, "e2fsprogs") {
		t.Errorf("without either: %q (%s), want dir saying budgets are off and naming e2fsprogs", name, why)
	}
}
