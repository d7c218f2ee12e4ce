package daemon

import (
	"encoding/binary"
	"testing"
)

// TestDefaultRangeAvoidsResting: a runnerd that is down (its claim stale,
// its state directory there) keeps its range for its return: a new
// default choice takes another slot while one is free, and the resting
// one only when every other is held. Without it a pod runnerd killed and
// restarted found its saved slot taken by another that started meanwhile
// ("identity range ... overlaps ... give each runnerd its own").
func TestDefaultRangeAvoidsResting(t *testing.T) {
	var sum [32]byte
	binary.BigEndian.PutUint32(sum[:4], 3) // starts at slot 3
	slot := func(k uint32) claim {
		first := uint32(identitySlotFirst) + k*podSlotSize
		return claim{StateDir: t.TempDir(), IdentityFirst: first, IdentityLast: first + podSlotSize - 1}
	}
	cfg := &Config{StateDir: t.TempDir(), Isolate: IsolatePod}
	if err := defaultIdentityRange(cfg, sum, false, nil, []claim{slot(3)}); err != nil {
		t.Fatal(err)
	}
	if want := slot(4); cfg.IdentityFirst != want.IdentityFirst {
		t.Errorf("with slot 3 resting: chose %d, want slot 4 (%d)", cfg.IdentityFirst, want.IdentityFirst)
	}
	var live, resting []claim
	for k := uint32(0); k < podSlots; k++ {
		if k == 7 {
			resting = append(resting, slot(k))
		} else {
			live = append(live, slot(k))
		}
	}
	cfg = &Config{StateDir: t.TempDir(), Isolate: IsolatePod}
	if err := defaultIdentityRange(cfg, sum, false, live, resting); err != nil {
		t.Fatal(err)
	}
	if want := slot(7); cfg.IdentityFirst != want.IdentityFirst {
		t.Errorf("every slot live but 7, resting: chose %d, want slot 7 (%d)", cfg.IdentityFirst, want.IdentityFirst)
	}
}
