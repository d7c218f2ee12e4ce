package storage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountFlags are the flags of every mount the pool makes: nothing on a
// volume can be a setuid program or a device node that works.
const mountFlags = unix.MS_NOSUID | unix.MS_NODEV

// mountLoop attaches file to a free loop device with LO_FLAGS_AUTOCLEAR
// and mounts it at point. The device lives exactly as long as the mount:
// the kernel frees it when the mount goes, and at once if the mount
// fails (the only other holder, this function's descriptor, is closed
// before it returns).
func mountLoop(file, point, fstype, data string) error {
	backing, err := os.OpenFile(file, os.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open image: %w", err)
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open loop control: %w", err)
	}
	defer ctl.Close()
	// Another process may take the free device between GET_FREE and
	// CONFIGURE (EBUSY): ask again.
	for range 32 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], file)
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) {
			lf.Close()
			continue
		}
		if err != nil {
			lf.Close()
			return fmt.Errorf("configure %s: %w", dev, err)
		}
		err = unix.Mount(dev, point, fstype, mountFlags, data)
		lf.Close() // the mount holds the device now, or nothing does
		if err != nil {
			return fmt.Errorf("mount %s on %s: %w", dev, point, err)
		}
		return nil
	}
	return errors.New("find a free loop device: every one was taken under us")
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point, fstype, source string
}

// mountAt returns the topmost mount at point, if any.
func mountAt(point string) (mount, bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return mount{}, false, fmt.Errorf("read mountinfo: %w", err)
	}
	var found mount
	ok := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source super
		pre, post, cut := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !cut || len(f) < 5 || len(g) < 2 {
			continue
		}
		if unescapeMount(f[4]) == point {
			found, ok = mount{point: point, fstype: g[0], source: unescapeMount(g[1])}, true
		}
	}
	return found, ok, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// loopBacking is the file behind loop device dev ("/dev/loopN"), from
// sysfs; "" when dev is not a configured loop device.
func loopBacking(dev string) string {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// mountedImage reports whether point has a mount of image through a loop
// device, and which device.
func mountedImage(point, image string) (dev string, ok bool, err error) {
	m, ok, err := mountAt(point)
	if err != nil || !ok {
		return "", false, err
	}
	if !strings.HasPrefix(m.source, "/dev/loop") || loopBacking(m.source) != image {
		return "", false, fmt.Errorf("%s is mounted from %s, not from %s", point, m.source, image)
	}
	return m.source, true, nil
}

// unmount detaches point if something is mounted there. The detach is
// lazy: a process still inside the volume (a sandbox's last command)
// keeps the file system until it leaves, and the loop device is freed
// then; nothing new can reach it.
func unmount(point string) error {
	for {
		_, ok, err := mountAt(point)
		if err != nil || !ok {
			return err
		}
		if err := unix.Unmount(point, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("unmount %s: %w", point, err)
		}
	}
}

// sharePoolDir makes the pool's directory a shared mount (a bind of
// itself, unless something is mounted there already), so that the
// mounts made under it, and above all their unmounts, propagate to the
// copies other mount namespaces took. Without it, every mount namespace
// made while a volume is mounted (a sandbox's command: the shim's helper
// makes one per spawn, as slave) keeps a private copy of the volume's
// mount after Delete unmounts it, and with it the file system and its
// loop device, until that namespace ends. bindMarker records that the
// bind is the pool's own, for Destroy to undo.
func sharePoolDir(dir string) error {
	_, mounted, err := mountAt(dir)
	if err != nil {
		return err
	}
	if !mounted {
		if err := writeFileSync(filepath.Join(dir, bindMarker), nil); err != nil {
			return fmt.Errorf("write bind marker: %w", err)
		}
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	return nil
}

// bindMarker is the file in a pool's directory that says the pool bound
// the directory on itself.
const bindMarker = "bind"

// unsharePoolDir undoes sharePoolDir's bind, if it made one.
func unsharePoolDir(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, bindMarker)); err != nil {
		return nil
	}
	if _, ok, err := mountAt(dir); err != nil || !ok {
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

// setCapacity tells loop device dev that its file grew.
func setCapacity(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := unix.IoctlRetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY); err != nil {
		return fmt.Errorf("set capacity of %s: %w", dev, err)
	}
	return nil
}

// run runs a file system tool and returns its standard output; its
// output is part of the error when it fails.
func run(ctx context.Context, name string, args ...string) (string, error) {
	path := toolPath(name)
	if path == "" {
		return "", fmt.Errorf("%s: not installed in %s", name, strings.Join(toolDirs, ", "))
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{"PATH=" + strings.Join(toolDirs, ":"), "LANG=C"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// makeSparse creates file (it must not exist) with size bytes, sparse.
func makeSparse(file string, size int64) error {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
