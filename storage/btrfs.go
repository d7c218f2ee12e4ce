package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// btrfsMinSize is the smallest pool file: mkfs.btrfs 6.2 refuses less
// than 109 MiB (114294784 bytes).
const btrfsMinSize = 128 << 20

// btrfsDriver keeps every volume in one btrfs file system on a loop
// device: dir/pool.img mounted at dir/mnt, volumes as subvolumes under
// mnt/volumes with a qgroup limit each, snapshots as read-only
// subvolumes under mnt/snapshots.
type btrfsDriver struct {
	dir  string
	size int64
}

var _ driver = (*btrfsDriver)(nil)

func (d *btrfsDriver) name() string  { return Btrfs }
func (d *btrfsDriver) budgets() bool { return true }
func (d *btrfsDriver) image() string { return filepath.Join(d.dir, "pool.img") }
func (d *btrfsDriver) mnt() string   { return filepath.Join(d.dir, "mnt") }
func (d *btrfsDriver) vols() string  { return filepath.Join(d.mnt(), "volumes") }
func (d *btrfsDriver) snaps() string { return filepath.Join(d.mnt(), "snapshots") }

func (d *btrfsDriver) path(name string) string { return filepath.Join(d.vols(), name) }

func (d *btrfsDriver) check(l Limits) error {
	if l.Inodes != 0 {
		return fmt.Errorf("%w: btrfs has no inode limit (asked for %d inodes); use the ext4 driver for one", ErrNotSupported, l.Inodes)
	}
	return nil
}

func (d *btrfsDriver) open(ctx context.Context) error {
	if err := sharePoolDir(d.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(d.mnt(), 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(d.image()); errors.Is(err, fs.ErrNotExist) {
		// Made under another name and renamed when whole, so a crash
		// mid-mkfs leaves no pool file that looks finished.
		tmp := d.image() + ".tmp"
		if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := makeSparse(tmp, d.size); err != nil {
			return fmt.Errorf("make pool file: %w", err)
		}
		if _, err := run(ctx, "mkfs.btrfs", "-q", "-f", tmp); err != nil {
			os.Remove(tmp)
			return err
		}
		if err := os.Rename(tmp, d.image()); err != nil {
			return err
		}
		if err := syncDir(d.dir); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	_, ok, err := mountedImage(d.mnt(), d.image())
	if err != nil {
		return err
	}
	if !ok {
		if err := mountLoop(d.image(), d.mnt(), "btrfs", ""); err != nil {
			return err
		}
	}
	if err := d.growPool(ctx); err != nil {
		return fmt.Errorf("grow pool to %d bytes: %w", d.size, err)
	}
	// Idempotent: a no-op where quotas are on.
	if _, err := run(ctx, "btrfs", "quota", "enable", d.mnt()); err != nil {
		return err
	}
	if err := os.MkdirAll(d.vols(), 0o711); err != nil {
		return err
	}
	if err := os.MkdirAll(d.snaps(), 0o700); err != nil {
		return err
	}
	return d.removeStaging(ctx) // cloneas.go
}

func listNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if nameRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (d *btrfsDriver) list() (vols, snaps []string, err error) {
	if vols, err = listNames(d.vols()); err != nil {
		return nil, nil, err
	}
	snaps, err = listNames(d.snaps())
	return vols, snaps, err
}

// limit sets the qgroup limit on referenced bytes of subvolume path.
func (d *btrfsDriver) limit(ctx context.Context, path string, bytes int64) error {
	v := "none"
	if bytes > 0 {
		v = strconv.FormatInt(bytes, 10)
	}
	_, err := run(ctx, "btrfs", "qgroup", "limit", v, path)
	return err
}

func (d *btrfsDriver) create(ctx context.Context, name string, l Limits) (Limits, error) {
	p := d.path(name)
	if _, err := run(ctx, "btrfs", "subvolume", "create", p); err != nil {
		return Limits{}, err
	}
	if err := d.limit(ctx, p, l.Bytes); err != nil {
		return Limits{}, err
	}
	return Limits{Bytes: l.Bytes}, os.Chmod(p, 0o755)
}

func (d *btrfsDriver) ensure(ctx context.Context, name string, l Limits) (Limits, error) {
	if _, err := os.Lstat(d.path(name)); err != nil {
		return Limits{}, err
	}
	return Limits{Bytes: l.Bytes}, nil
}

func (d *btrfsDriver) grow(ctx context.Context, name string, old, l Limits) (Limits, error) {
	if err := d.limit(ctx, d.path(name), l.Bytes); err != nil {
		return Limits{}, err
	}
	return Limits{Bytes: l.Bytes}, nil
}

// usage reads the volume's qgroup: bytes referenced, synced first so
// that what was written is counted.
func (d *btrfsDriver) usage(ctx context.Context, name string) (Usage, error) {
	return d.usageAt(ctx, d.path(name))
}

// usageAt is usage of the subvolume at p.
func (d *btrfsDriver) usageAt(ctx context.Context, p string) (Usage, error) {
	out, err := run(ctx, "btrfs", "qgroup", "show", "--raw", "--sync", "-f", p)
	if err != nil {
		return Usage{}, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasPrefix(f[0], "0/") {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return Usage{}, fmt.Errorf("parse qgroup line %q: %w", line, err)
			}
			return Usage{Bytes: n, Inodes: -1}, nil
		}
	}
	return Usage{}, fmt.Errorf("no qgroup in %q", out)
}

func (d *btrfsDriver) snapshot(ctx context.Context, name, snap string) error {
	_, err := run(ctx, "btrfs", "subvolume", "snapshot", "-r", d.path(name), filepath.Join(d.snaps(), snap))
	return err
}

func (d *btrfsDriver) clone(ctx context.Context, snap, name string, l Limits) (Limits, error) {
	p := d.path(name)
	if _, err := run(ctx, "btrfs", "subvolume", "snapshot", filepath.Join(d.snaps(), snap), p); err != nil {
		return Limits{}, err
	}
	if err := d.limit(ctx, p, l.Bytes); err != nil {
		return Limits{}, err
	}
	return Limits{Bytes: l.Bytes}, nil
}

func (d *btrfsDriver) remove(ctx context.Context, name string) error {
	return d.removeSubvolume(ctx, d.path(name))
}

func (d *btrfsDriver) removeSnapshot(ctx context.Context, snap string) error {
	return d.removeSubvolume(ctx, filepath.Join(d.snaps(), snap))
}

// removeSubvolume deletes the subvolume at p and every subvolume nested
// in it, deepest first, by id: the nested ones' paths are the
// sandbox's to change (a directory renamed to a symlink would point a
// delete by path elsewhere). It waits until the cleaner has freed the
// space. Absent is success.
func (d *btrfsDriver) removeSubvolume(ctx context.Context, p string) error {
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	out, err := run(ctx, "btrfs", "inspect-internal", "rootid", p)
	if err != nil {
		return err
	}
	root := strings.TrimSpace(out)
	if root == "5" {
		// Not a subvolume: a plain directory a crash left before
		// `subvolume create` made it (it never does) or a stray one.
		return os.RemoveAll(p)
	}
	rootID, err := strconv.ParseUint(root, 10, 64)
	if err != nil {
		return fmt.Errorf("parse subvolume id %q: %w", root, err)
	}
	var order []string // post-order: children before their parent
	var walk func(id uint64, depth int) error
	walk = func(id uint64, depth int) error {
		if depth > 4096 {
			return errors.New("subvolumes nested too deep")
		}
		children, err := nestedSubvolumes(d.mnt(), id)
		if err != nil {
			return err
		}
		for _, c := range children {
			if err := walk(c, depth+1); err != nil {
				return err
			}
		}
		order = append(order, strconv.FormatUint(id, 10))
		return nil
	}
	if err := walk(rootID, 0); err != nil {
		return err
	}
	// -c: the deletion commits its transaction, so the cleaner starts
	// now rather than at the next periodic commit (30 s), which the sync
	// below would wait for.
	for _, id := range order {
		if _, err := run(ctx, "btrfs", "subvolume", "delete", "-c", "-i", id, d.mnt()); err != nil {
			return err
		}
	}
	args := append([]string{"subvolume", "sync", d.mnt()}, order...)
	_, err = run(ctx, "btrfs", args...)
	return err
}

func (d *btrfsDriver) destroy(ctx context.Context) error {
	if err := unmount(d.mnt()); err != nil {
		return err
	}
	if err := os.Remove(d.image()); err != nil {
		return err
	}
	return unsharePoolDir(d.dir)
}

// growPool extends a mounted pool whose file is smaller than the
// configured size: the file, the loop device's capacity, then the file
// system. A pool never shrinks: a smaller size leaves it as it is.
func (d *btrfsDriver) growPool(ctx context.Context) error {
	fi, err := os.Stat(d.image())
	if err != nil {
		return err
	}
	if fi.Size() >= d.size {
		return nil
	}
	dev, ok, err := mountedImage(d.mnt(), d.image())
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("pool is not mounted")
	}
	if err := os.Truncate(d.image(), d.size); err != nil {
		return err
	}
	if err := setCapacity(dev); err != nil {
		return err
	}
	_, err = run(ctx, "btrfs", "filesystem", "resize", "max", d.mnt())
	return err
}
