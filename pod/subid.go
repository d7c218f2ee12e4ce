package pod

import (
	"errors"
	"fmt"
)

// BlockSize is the number of ids one pod maps: uid and gid 0..65535
// inside, what a Debian system's users and groups need (nobody is 65534).
const BlockSize = 65536

// ErrRange is returned by NewRanges for a range that cannot hold a block
// or would wrap, and by Ranges.Block for an index outside it.
var ErrRange = errors.New("subordinate id range")

// Ranges carves a subordinate id range (an operator's --subid-range:
// base, size) into blocks of BlockSize ids, by index: block k is
// [base + k·BlockSize, base + (k+1)·BlockSize). It is a pure value; which
// index a sandbox holds is the registry's to allocate and claim. Safe for
// concurrent use (immutable).
type Ranges struct {
	base, blocks uint32
}

// NewRanges returns the blocks of [base, base+size). The range must hold
// at least one block, stay below 2^32-1 (the kernel's invalid id), and
// must not start at 0 (uid 0 outside is the host's root: a block there
// would make a pod's root the host's). A size that is not a multiple of
// BlockSize leaves its tail unused.
func NewRanges(base, size uint32) (Ranges, error) {
	if base == 0 {
		return Ranges{}, fmt.Errorf("%w: base 0 would map a pod's root to the host's", ErrRange)
	}
	n := size / BlockSize
	if n == 0 {
		return Ranges{}, fmt.Errorf("%w: size %d holds no block of %d ids", ErrRange, size, BlockSize)
	}
	// The last id of the last block must be below 2^32-1 ((uid_t)-1).
	if uint64(base)+uint64(n)*BlockSize > 1<<32-1 {
		return Ranges{}, fmt.Errorf("%w: %d+%d passes the last valid id", ErrRange, base, size)
	}
	return Ranges{base: base, blocks: n}, nil
}

// Len is the number of blocks.
func (r Ranges) Len() int { return int(r.blocks) }

// Block returns the first id outside of block i (uid and gid 0 inside).
func (r Ranges) Block(i int) (uint32, error) {
	if i < 0 || i >= int(r.blocks) {
		return 0, fmt.Errorf("%w: block %d of %d", ErrRange, i, r.blocks)
	}
	return r.base + uint32(i)*BlockSize, nil
}

// Index returns the block that id (outside) falls in, and whether it
// falls in one at all.
func (r Ranges) Index(id uint32) (int, bool) {
	if id < r.base || uint64(id) >= uint64(r.base)+uint64(r.blocks)*BlockSize {
		return 0, false
	}
	return int((id - r.base) / BlockSize), true
}
