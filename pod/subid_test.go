package pod

import (
	"errors"
	"testing"
)

func TestRanges(t *testing.T) {
	for _, tc := range []struct {
		name       string
		base, size uint32
		want       int // blocks; -1: ErrRange
	}{
		{"one block", 1 << 20, BlockSize, 1},
		{"tail unused", 1 << 20, 3*BlockSize + 100, 3},
		{"too small", 1 << 20, BlockSize - 1, -1},
		{"zero base", 0, 10 * BlockSize, -1},
		{"to the last valid id", 1<<32 - 1 - 2*BlockSize, 2 * BlockSize, 2},
		{"past the last valid id", 1<<32 - 2*BlockSize, 2 * BlockSize, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewRanges(tc.base, tc.size)
			if tc.want < 0 {
				if !errors.Is(err, ErrRange) {
					t.Fatalf("got %v, want ErrRange", err)
				}
				return
			}
			if err != nil || r.Len() != tc.want {
				t.Fatalf("got %d blocks (%v), want %d", r.Len(), err, tc.want)
			}
		})
	}
}

func TestRangesBlocks(t *testing.T) {
	r, err := NewRanges(0x10000000, 4*BlockSize+7)
	if err != nil {
		t.Fatal(err)
	}
	for i := range r.Len() {
		b, err := r.Block(i)
		if want := uint32(0x10000000 + i*BlockSize); err != nil || b != want {
			t.Fatalf("Block(%d) = %d, %v; want %d", i, b, err, want)
		}
		for _, id := range []uint32{b, b + 1, b + BlockSize - 1} {
			if got, ok := r.Index(id); !ok || got != i {
				t.Errorf("Index(%d) = %d, %v; want %d", id, got, ok, i)
			}
		}
	}
	for _, i := range []int{-1, 4} {
		if _, err := r.Block(i); !errors.Is(err, ErrRange) {
			t.Errorf("Block(%d): got %v, want ErrRange", i, err)
		}
	}
	for _, id := range []uint32{0x10000000 - 1, 0x10000000 + 4*BlockSize, 0x10000000 + 4*BlockSize + 6} {
		if _, ok := r.Index(id); ok {
			t.Errorf("Index(%d): in a block, want outside (the unused tail too)", id)
		}
	}
}
