package storage

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// toolDirs are where the file system tools are looked for (and the PATH
// they run with).
var toolDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

func haveTool(name string) bool { return toolPath(name) != "" }

// toolPath is the file system tool name in toolDirs, or "": the tools
// are found there whatever PATH runnerd was started with (sbin
// directories are often missing from a service's or a user's PATH).
func toolPath(name string) string {
	for _, d := range toolDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// kernelHas reports whether the running kernel has file system fstype:
// registered now, or a module it can load at mount.
func kernelHas(fstype string) bool {
	b, _ := os.ReadFile("/proc/filesystems")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(strings.TrimPrefix(l, "nodev")) == fstype {
			return true
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	rel := string(bytes.TrimRight(u.Release[:], "\x00"))
	_, err := os.Stat(filepath.Join("/lib/modules", rel, "kernel/fs", fstype))
	return err == nil
}

// DefaultDriver picks the driver for a pool when the operator names
// none, and says why: btrfs (snapshots in milliseconds, one loop device
// for every volume) where the kernel has btrfs and loop devices and
// mkfs.btrfs and btrfs(8) are installed (Debian's btrfs-progs); ext4 (a
// loop device and a mkfs per volume, no snapshots, but inode limits)
// where mkfs.ext4 and resize2fs are (e2fsprogs, on every Debian); dir,
// which holds no budget, otherwise.
func DefaultDriver() (name, why string) {
	loop := true
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		loop = false
	}
	var missing []string
	if !loop {
		missing = append(missing, "loop devices (/dev/loop-control)")
	}
	if !kernelHas("btrfs") {
		missing = append(missing, "the kernel's btrfs")
	}
	for _, t := range []string{"mkfs.btrfs", "btrfs"} {
		if !haveTool(t) {
			missing = append(missing, t+" (Debian: apt-get install btrfs-progs)")
		}
	}
	if len(missing) == 0 {
		return Btrfs, "btrfs: the kernel has btrfs and loop devices, btrfs-progs is installed"
	}
	noBtrfs := "btrfs needs " + strings.Join(missing, ", ")
	var missing4 []string
	if !loop {
		missing4 = append(missing4, "loop devices")
	}
	if !kernelHas("ext4") {
		missing4 = append(missing4, "the kernel's ext4")
	}
	for _, t := range []string{"mkfs.ext4", "resize2fs"} {
		if !haveTool(t) {
			missing4 = append(missing4, t+" (Debian: e2fsprogs)")
		}
	}
	if len(missing4) == 0 {
		return Ext4, "ext4, not btrfs: " + noBtrfs
	}
	return Dir, "dir (no disk budgets): " + noBtrfs + "; ext4 needs " + strings.Join(missing4, ", ")
}
