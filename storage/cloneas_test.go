package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCloneAs (btrfs): the clone is prepared where no uid but root
// reaches (its path does not exist yet, and the staging's parent is
// root's 0700), gets the limits asked (not the snapshot's), and appears
// at its path only prepared; a clone over its limit, or one whose prepare
// fails, leaves no volume, record or staging; a staging a crash left is
// removed by the next Open; the dir driver refuses it.
func TestCloneAs(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, Btrfs, 256*mib)
	v, err := p.Create(ctx, "src", Limits{Bytes: 64 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fill(filepath.Join(v.Path, "data"), 20*mib); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.Path, "f"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Snapshot(ctx, "src", "snap"); err != nil {
		t.Fatal(err)
	}
	var seen string
	c, err := p.CloneAs(ctx, "snap", "dst", Limits{Bytes: 32 * mib}, func(root string) error {
		seen = root
		if _, err := os.Lstat(p.Path("dst")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("during prepare the clone's path exists (%v): reachable before it is prepared", err)
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Dir(root), &st); err != nil || st.Uid != 0 || st.Mode&0o077 != 0 {
			t.Errorf("the staging's parent is %o owned by %d (%v), want root's 0700", st.Mode&0o7777, st.Uid, err)
		}
		return os.WriteFile(filepath.Join(root, "prepared"), []byte("yes"), 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.Bytes != 32*mib || c.Path != p.Path("dst") {
		t.Errorf("clone = %+v, want limits 32 MiB at %s", c, p.Path("dst"))
	}
	for f, want := range map[string]string{"f": "one", "prepared": "yes"} {
		if b, err := os.ReadFile(filepath.Join(c.Path, f)); err != nil || string(b) != want {
			t.Errorf("clone's %s = %q, %v; want %q", f, b, err, want)
		}
	}
	if _, err := os.Lstat(seen); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the staging %s outlived the clone: %v", seen, err)
	}
	// Its budget is the one asked: 12 MiB more fit, not 30.
	if n, err := fill(filepath.Join(c.Path, "more"), 30*mib); err == nil || n > 13*mib {
		t.Errorf("wrote %d bytes into a 32 MiB clone holding 20 MiB (%v), want EDQUOT near 12 MiB", n, err)
	}

	// Over the limit once prepared, and a failing prepare: nothing left.
	if _, err := p.CloneAs(ctx, "snap", "small", Limits{Bytes: 8 * mib}, nil); !errors.Is(err, unix.EDQUOT) {
		t.Errorf("CloneAs over its limit = %v, want EDQUOT", err)
	}
	boom := errors.New("boom")
	if _, err := p.CloneAs(ctx, "snap", "failed", Limits{Bytes: 64 * mib}, func(string) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("CloneAs with a failing prepare = %v, want its error", err)
	}
	for _, name := range []string{"small", "failed"} {
		if _, err := os.Lstat(p.Path(name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a failed CloneAs left volume %s: %v", name, err)
		}
		if _, err := p.readRecord("vol", name); !errors.Is(err, ErrNotFound) {
			t.Errorf("a failed CloneAs left the record of %s: %v", name, err)
		}
	}
	if _, err := p.CloneAs(ctx, "snap", "dst", Limits{}, nil); !errors.Is(err, ErrExists) {
		t.Errorf("CloneAs onto an existing volume = %v, want ErrExists", err)
	}
	if _, err := p.CloneAs(ctx, "nosnap", "x", Limits{}, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("CloneAs of an unknown snapshot = %v, want ErrNotFound", err)
	}

	// A crash mid-prepare: the staging stays, the next Open removes it.
	d := p.drv.(*btrfsDriver)
	if _, err := run(ctx, "btrfs", "subvolume", "snapshot", filepath.Join(d.snaps(), "snap"), d.staging("crashed")); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	q, err := Open(ctx, Config{Dir: p.dir, Driver: Btrfs, Size: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := os.Lstat(d.staging("crashed")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open left a crashed clone's staging: %v", err)
	}
	if snaps, err := q.Snapshots(); err != nil || len(snaps) != 1 || snaps[0] != "snap" {
		t.Errorf("Snapshots = %v, %v; want [snap]", snaps, err)
	}

	dir := openPool(t, Dir, 0)
	if _, err := dir.CloneAs(ctx, "snap", "x", Limits{}, nil); !errors.Is(err, ErrNotSupported) {
		t.Errorf("CloneAs on the dir driver = %v, want not supported", err)
	}
}
