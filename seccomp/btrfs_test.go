package seccomp

import (
	"runtime"
	"testing"
)

// iow is linux/ioctl.h's _IOW on x86_64 and arm64 (the generic encoding:
// direction in bits 30-31, size in 16-29, type in 8-15, number in 0-7).
func iow(typ, nr, size uint32) uint32 { return 1<<30 | size<<16 | typ<<8 | nr }

// TestBtrfsIoctlConstants recomputes the denied requests from
// linux/btrfs.h's definitions, so a typo in a constant cannot open the
// hole the rule closes.
func TestBtrfsIoctlConstants(t *testing.T) {
	const magic, volArgs, volArgsV2 = 0x94, 4096, 4096
	for _, tc := range []struct {
		name string
		got  uint32
		want uint32
	}{
		{"BTRFS_IOC_SNAP_CREATE", btrfsIocSnapCreate, iow(magic, 1, volArgs)},
		{"BTRFS_IOC_SUBVOL_CREATE", btrfsIocSubvolCreate, iow(magic, 14, volArgs)},
		{"BTRFS_IOC_SNAP_DESTROY", btrfsIocSnapDestroy, iow(magic, 15, volArgs)},
		{"BTRFS_IOC_SNAP_CREATE_V2", btrfsIocSnapCreateV2, iow(magic, 23, volArgsV2)},
		{"BTRFS_IOC_SUBVOL_CREATE_V2", btrfsIocSubvolCreateV2, iow(magic, 24, volArgsV2)},
		{"BTRFS_IOC_SNAP_DESTROY_V2", btrfsIocSnapDestroyV2, iow(magic, 63, volArgsV2)},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %#x, want %#x", tc.name, tc.got, tc.want)
		}
	}
	if len(deniedBtrfsIoctls) != 6 {
		t.Errorf("deniedBtrfsIoctls has %d requests, want the 6 above", len(deniedBtrfsIoctls))
	}
}

// TestBtrfsSubvolumeIoctlsDenied: the filter answers EPERM to each
// subvolume and snapshot ioctl, also with garbage in the request's high
// 32 bits (which the kernel drops), and still allows the ioctls a
// workload needs, btrfs's harmless ones among them, and the same numbers
// as another call's argument.
func TestBtrfsSubvolumeIoctlsDenied(t *testing.T) {
	f := mustDefault(t)
	info := nativeArch[runtime.GOARCH]
	ioctl := uint32(info.SyscallNames["ioctl"])
	for _, req := range deniedBtrfsIoctls {
		for _, high := range []uint64{0, 1 << 32, 0xffffffff << 32} {
			if got := eval(t, f, uint32(info.ID), ioctl, 3, high|uint64(req), 0x7fff0000); got != retEPERM {
				t.Errorf("ioctl(3, %#x): got %#x, want EPERM %#x", high|uint64(req), got, retEPERM)
			}
		}
	}
	for _, tc := range []struct {
		name string
		req  uint64
	}{
		{"TCGETS", 0x5401},
		{"FIONREAD", 0x541b},
		{"FICLONE (reflink: counted in the volume's quota group)", uint64(iow(0x94, 9, 4))},
		{"BTRFS_IOC_SYNC", 0x9408},
		{"BTRFS_IOC_SUBVOL_GETFLAGS", 0x80089419},
		{"BTRFS_IOC_SNAP_CREATE with another size", uint64(iow(0x94, 1, 8))},
	} {
		if got := eval(t, f, uint32(info.ID), ioctl, 3, tc.req); got != retAllow {
			t.Errorf("ioctl %s (%#x): got %#x, want allow", tc.name, tc.req, got)
		}
	}
	for _, call := range []string{"write", "read", "fcntl"} {
		nr := uint32(info.SyscallNames[call])
		if got := eval(t, f, uint32(info.ID), nr, 3, btrfsIocSubvolCreate); got != retAllow {
			t.Errorf("%s(3, %#x): got %#x, want allow (only ioctl's request is compared)", call, btrfsIocSubvolCreate, got)
		}
	}
}
