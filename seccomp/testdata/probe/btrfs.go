package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// linux/btrfs.h requests (the seccomp package denies them; its
// TestBtrfsIoctlConstants recomputes the numbers).
const (
	iocSnapCreate     = 0x50009401
	iocSubvolCreate   = 0x5000940e
	iocSnapDestroy    = 0x5000940f
	iocSnapCreateV2   = 0x50009417
	iocSubvolCreateV2 = 0x50009418
	iocSnapDestroyV2  = 0x5000943f
)

// volArgs is struct btrfs_ioctl_vol_args; volArgsV2 struct
// btrfs_ioctl_vol_args_v2 (the union of size/qgroup_inherit/unused as
// unused, the one of name/devid/subvolid as name). Both are 4096 bytes.
type volArgs struct {
	fd   int64
	name [4088]byte
}

type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

func ioctl(dir *os.File, req uintptr, arg unsafe.Pointer) unix.Errno {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, dir.Fd(), req, uintptr(arg))
	return e
}

// btrfsIoctls tries each subvolume and snapshot ioctl on directory dir
// (a btrfs subvolume's root), one "name errno" line each: it creates
// subvolumes n1 and n2 and snapshots s1 and s2 of dir in dir, and
// destroys n1 and n2.
func btrfsIoctls(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		die("open %s: %v", dir, err)
	}
	defer d.Close()
	v1 := func(name string, fd int64) *volArgs {
		a := &volArgs{fd: fd}
		copy(a.name[:], name)
		return a
	}
	v2 := func(name string, fd int64) *volArgsV2 {
		a := &volArgsV2{fd: fd}
		copy(a.name[:], name)
		return a
	}
	src := int64(d.Fd())
	for _, p := range []struct {
		name string
		req  uintptr
		arg  unsafe.Pointer
	}{
		{"subvol_create", iocSubvolCreate, unsafe.Pointer(v1("n1", 0))},
		{"subvol_create_v2", iocSubvolCreateV2, unsafe.Pointer(v2("n2", 0))},
		{"snap_create", iocSnapCreate, unsafe.Pointer(v1("s1", src))},
		{"snap_create_v2", iocSnapCreateV2, unsafe.Pointer(v2("s2", src))},
		{"snap_destroy", iocSnapDestroy, unsafe.Pointer(v1("n1", 0))},
		{"snap_destroy_v2", iocSnapDestroyV2, unsafe.Pointer(v2("n2", 0))},
		// The kernel takes the request as an unsigned int: garbage in the
		// high bits must not get past the filter.
		{"subvol_create_high_bits", 0xdead<<32 | iocSubvolCreate, unsafe.Pointer(v1("n3", 0))},
	} {
		fmt.Printf("%s %d\n", p.name, int(ioctl(d, p.req, p.arg)))
	}
}

// btrfsEscape is the attack on a qgroup limit: create a nested
// subvolume in dir (whose quota group has no limit) and write n bytes
// into it; where the create is refused, write them into a plain
// directory instead. It prints "subvol_create errno" and "written bytes
// errno".
func btrfsEscape(dir, size string) {
	n, err := strconv.ParseInt(size, 10, 64)
	if err != nil {
		die("size: %v", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		die("open %s: %v", dir, err)
	}
	a := &volArgsV2{}
	copy(a.name[:], "nested")
	e := ioctl(d, iocSubvolCreateV2, unsafe.Pointer(a))
	d.Close()
	fmt.Printf("subvol_create %d\n", int(e))
	nested := filepath.Join(dir, "nested")
	if e != 0 {
		if err := os.Mkdir(nested, 0o755); err != nil {
			die("mkdir: %v", err)
		}
	}
	f, err := os.Create(filepath.Join(nested, "f"))
	if err != nil {
		die("create: %v", err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	var written int64
	var werr error
	for written < n && werr == nil {
		var k int
		k, werr = f.Write(buf[:min(int64(len(buf)), n-written)])
		written += int64(k)
	}
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	var errno unix.Errno
	if werr != nil {
		if pe, ok := werr.(*os.PathError); ok {
			errno, _ = pe.Err.(unix.Errno)
		}
		if errno == 0 {
			die("write: %v", werr)
		}
	}
	fmt.Printf("written %d %d\n", written, int(errno))
}
