package storage

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The root tree search that finds a subvolume's nested subvolumes
// (linux/btrfs.h, linux/btrfs_tree.h). It reads ROOT_REF items, keyed
// (parent id, ROOT_REF, child id), so no name a sandbox chose is ever
// parsed: `btrfs subvolume list` prints names raw, and a subvolume named
// "x\nID 258 gen 1 top level 256 path y" adds a line that would point a
// delete at another volume.
const (
	btrfsIocTreeSearch = 0xd0009411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args)
	btrfsRootTreeID    = 1
	btrfsRootRefKey    = 156
	searchBufSize      = 4096 - 104
	searchHeaderSize   = 32
)

// searchKey is struct btrfs_ioctl_search_key.
type searchKey struct {
	treeID, minObjectID, maxObjectID, minOffset, maxOffset, minTransID, maxTransID uint64
	minType, maxType, nrItems, unused                                              uint32
	unused1, unused2, unused3, unused4                                             uint64
}

// searchArgs is struct btrfs_ioctl_search_args.
type searchArgs struct {
	key searchKey
	buf [searchBufSize]byte
}

// nestedSubvolumes returns the ids of the subvolumes whose parent is
// subvolume parent, in the file system mounted at mnt.
func nestedSubvolumes(mnt string, parent uint64) ([]uint64, error) {
	f, err := os.Open(mnt)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []uint64
	next := uint64(0)
	for {
		args := &searchArgs{key: searchKey{
			treeID: btrfsRootTreeID, minObjectID: parent, maxObjectID: parent,
			minType: btrfsRootRefKey, maxType: btrfsRootRefKey,
			minOffset: next, maxOffset: ^uint64(0), maxTransID: ^uint64(0),
			nrItems: 4096,
		}}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), btrfsIocTreeSearch, uintptr(unsafe.Pointer(args)))
		if e != 0 {
			return nil, fmt.Errorf("search the root tree: %w", e)
		}
		if args.key.nrItems == 0 {
			return out, nil
		}
		pos := 0
		for range args.key.nrItems {
			if pos+searchHeaderSize > len(args.buf) {
				return nil, fmt.Errorf("search the root tree: answer overruns its buffer")
			}
			h := args.buf[pos:]
			objectID := binary.NativeEndian.Uint64(h[8:])
			offset := binary.NativeEndian.Uint64(h[16:])
			typ := binary.NativeEndian.Uint32(h[24:])
			length := binary.NativeEndian.Uint32(h[28:])
			pos += searchHeaderSize + int(length)
			if objectID == parent && typ == btrfsRootRefKey {
				out = append(out, offset)
			}
			next = offset + 1
		}
		if next == 0 { // wrapped: the last possible id was read
			return out, nil
		}
	}
}
