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

	"golang.org/x/sys/unix"
)

// ext4MinBytes is the smallest ext4 volume: below it mkfs.ext4's own
// structures leave next to nothing.
const ext4MinBytes = 8 << 20

// ext4Driver makes a file system per volume: dir/images/NAME.img, made
// by mkfs.ext4, mounted through a loop device at dir/volumes/NAME.
type ext4Driver struct {
	dir string
}

var _ driver = (*ext4Driver)(nil)

func (d *ext4Driver) name() string  { return Ext4 }
func (d *ext4Driver) budgets() bool { return true }
func (d *ext4Driver) images() string {
	return filepath.Join(d.dir, "images")
}
func (d *ext4Driver) image(name string) string { return filepath.Join(d.images(), name+".img") }
func (d *ext4Driver) path(name string) string  { return filepath.Join(d.dir, "volumes", name) }

func (d *ext4Driver) check(l Limits) error {
	if l.Bytes < ext4MinBytes {
		return fmt.Errorf("%w: an ext4 volume needs a size of at least %d bytes (asked for %d)", ErrInvalid, ext4MinBytes, l.Bytes)
	}
	return nil
}

func (d *ext4Driver) open(ctx context.Context) error {
	if err := sharePoolDir(d.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(d.images(), 0o700); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Join(d.dir, "volumes"), 0o711)
}

func (d *ext4Driver) list() (vols, snaps []string, err error) {
	imgs, err := os.ReadDir(d.images())
	if err != nil {
		return nil, nil, err
	}
	for _, e := range imgs {
		if n, ok := strings.CutSuffix(e.Name(), ".img"); ok && nameRE.MatchString(n) {
			vols = append(vols, n)
		}
	}
	points, err := listNames(filepath.Join(d.dir, "volumes"))
	if err != nil {
		return nil, nil, err
	}
	for _, n := range points {
		if !contains(vols, n) {
			vols = append(vols, n)
		}
	}
	return vols, nil, nil
}

func (d *ext4Driver) create(ctx context.Context, name string, l Limits) (Limits, error) {
	img := d.image(name)
	if err := makeSparse(img, l.Bytes); err != nil {
		return Limits{}, fmt.Errorf("make image: %w", err)
	}
	// -m 0: no blocks reserved for root (uid 0 outside; the sandbox's
	// root is not it, so they would only be lost). -N: the inode count.
	args := []string{"-q", "-F", "-m", "0", "-E", "root_owner=0:0"}
	if l.Inodes > 0 {
		args = append(args, "-N", strconv.FormatInt(l.Inodes, 10))
	}
	if _, err := run(ctx, "mkfs.ext4", append(args, img)...); err != nil {
		return Limits{}, err
	}
	return d.ensure(ctx, name, l)
}

// ensure mounts the volume if it is not mounted, and returns the limits
// the kernel holds: the image's size, and the inodes mkfs made.
func (d *ext4Driver) ensure(ctx context.Context, name string, l Limits) (Limits, error) {
	p := d.path(name)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return Limits{}, err
	}
	_, ok, err := mountedImage(p, d.image(name))
	if err != nil {
		return Limits{}, err
	}
	if !ok {
		if err := mountLoop(d.image(name), p, "ext4", ""); err != nil {
			return Limits{}, err
		}
	}
	return d.held(name)
}

func (d *ext4Driver) held(name string) (Limits, error) {
	fi, err := os.Stat(d.image(name))
	if err != nil {
		return Limits{}, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.path(name), &st); err != nil {
		return Limits{}, fmt.Errorf("statfs: %w", err)
	}
	return Limits{Bytes: fi.Size(), Inodes: int64(st.Files)}, nil
}

// grow extends the image, tells the loop device and resizes the mounted
// file system. ext4 makes inodes only with new block groups, so more
// inodes than the new size brings are refused before anything changes.
func (d *ext4Driver) grow(ctx context.Context, name string, old, l Limits) (Limits, error) {
	cur, err := d.held(name)
	if err != nil {
		return Limits{}, err
	}
	if l.Inodes > cur.Inodes {
		// Inodes per block group are fixed at mkfs: they grow with the
		// size, in proportion (rounded down: a projection that never
		// promises more than the resize gives).
		projected := cur.Inodes / 8 * 8 * (l.Bytes / (1 << 20)) / max(cur.Bytes/(1<<20), 1)
		if l.Bytes <= cur.Bytes || projected < l.Inodes {
			return Limits{}, fmt.Errorf("%w: ext4 makes inodes only with size: %d bytes hold about %d inodes, not %d", ErrNotSupported, l.Bytes, max(projected, cur.Inodes), l.Inodes)
		}
	}
	if l.Bytes > cur.Bytes {
		if !haveCap(unix.CAP_SYS_RESOURCE) {
			// The kernel's online resize (EXT4_IOC_RESIZE_FS) asks for it;
			// an offline one would unmount a volume in use.
			return Limits{}, fmt.Errorf("%w: growing a mounted ext4 volume needs CAP_SYS_RESOURCE, which runnerd lacks", ErrNotSupported)
		}
		dev, ok, err := mountedImage(d.path(name), d.image(name))
		if err != nil {
			return Limits{}, err
		}
		if !ok {
			return Limits{}, errors.New("volume is not mounted")
		}
		if err := os.Truncate(d.image(name), l.Bytes); err != nil {
			return Limits{}, fmt.Errorf("extend image: %w", err)
		}
		if err := setCapacity(dev); err != nil {
			return Limits{}, errors.Join(err, d.shrinkImage(name, dev, cur.Bytes))
		}
		if _, err := run(ctx, "resize2fs", dev); err != nil {
			// The file system kept its size: so does the image, whose
			// size is what the volume reports as its limit.
			return Limits{}, errors.Join(err, d.shrinkImage(name, dev, cur.Bytes))
		}
	}
	return d.held(name)
}

// shrinkImage puts the image of a grow that failed back to size, which
// the file system on it never left.
func (d *ext4Driver) shrinkImage(name, dev string, size int64) error {
	if err := os.Truncate(d.image(name), size); err != nil {
		return fmt.Errorf("restore image size: %w", err)
	}
	return setCapacity(dev)
}

func (d *ext4Driver) usage(ctx context.Context, name string) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(d.path(name), &st); err != nil {
		return Usage{}, fmt.Errorf("statfs: %w", err)
	}
	return Usage{
		Bytes:  int64(st.Blocks-st.Bfree) * st.Bsize,
		Inodes: int64(st.Files - st.Ffree),
	}, nil
}

func (d *ext4Driver) snapshot(ctx context.Context, name, snap string) error {
	return fmt.Errorf("%w: the ext4 driver has no snapshots", ErrNotSupported)
}

func (d *ext4Driver) clone(ctx context.Context, snap, name string, l Limits) (Limits, error) {
	return Limits{}, fmt.Errorf("%w: the ext4 driver has no snapshots", ErrNotSupported)
}

func (d *ext4Driver) remove(ctx context.Context, name string) error {
	p := d.path(name)
	if err := unmount(p); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Remove(d.image(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (d *ext4Driver) removeSnapshot(ctx context.Context, snap string) error { return nil }
func (d *ext4Driver) destroy(ctx context.Context) error                     { return unsharePoolDir(d.dir) }

// haveCap reports whether the calling thread has capability c effective.
func haveCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}
