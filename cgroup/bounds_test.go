package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestV1KernelBounds: the bounds Validate states are the kernel's own:
// each maximum is accepted and held (read back equal), and one step
// beyond it is what the kernel refuses (pids.max, cpu.cfs_quota_us) or
// would silently turn into no limit (memory). Validate refuses that step.
func TestV1KernelBounds(t *testing.T) {
	m := newTestManager(t, ModeV1)
	at := Limits{MemoryBytes: MaxMemoryBytes, Pids: MaxPids, CPUQuota: MaxCPUQuota}
	if err := m.Ensure("sb", at); err != nil {
		t.Fatalf("Ensure at the maxima: %v", err)
	}
	h, err := m.b.held("sb")
	if err != nil || h != at.want() {
		t.Fatalf("held at the maxima = %+v, %v; want %+v", h, err, at.want())
	}
	for _, tc := range []struct {
		hier, file string
		beyond     int64
		over       Limits
	}{
		{"pids", "pids.max", MaxPids + 1, Limits{Pids: MaxPids + 1}},
		{"cpu", "cpu.cfs_quota_us", MaxCPUQuota.Microseconds() + 1, Limits{CPUQuota: MaxCPUQuota + time.Microsecond}},
	} {
		p := filepath.Join(sandboxDir(t, m, "sb", tc.hier), tc.file)
		if err := os.WriteFile(p, []byte(strconv.FormatInt(tc.beyond, 10)), 0); err == nil {
			t.Errorf("the kernel took %d in %s: the bound is not its maximum", tc.beyond, tc.file)
		}
		if err := tc.over.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalid", tc.over, err)
		}
	}
	// Memory: the kernel takes a value above PAGE_COUNTER_MAX pages and
	// holds "no limit"; a value that is not whole pages it rounds down.
	p := filepath.Join(sandboxDir(t, m, "sb", "memory"), "memory.limit_in_bytes")
	// memsw must stay at or above the limit: lifted first.
	os.WriteFile(filepath.Join(filepath.Dir(p), "memory.memsw.limit_in_bytes"), []byte("-1"), 0)
	for _, v := range []int64{1<<63 - 1, MinMemoryBytes + 1} {
		if err := os.WriteFile(p, []byte(strconv.FormatInt(v, 10)), 0); err != nil {
			t.Fatalf("write %d: %v", v, err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := parseMemory(string(got[:len(got)-1])); n == v {
			t.Errorf("the kernel holds %d as written: the bound is wrong", v)
		}
		if err := (Limits{MemoryBytes: v}).Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(memory %d) = %v, want ErrInvalid", v, err)
		}
	}
}

// TestVerifyCatchesWhatIsNotHeld: a limit the kernel does not hold after
// the write (here a memory.max turned back to "max" behind the manager's
// back, as the kernel does with an out-of-range value) fails Ensure's
// check with ErrNotHeld.
func TestVerifyCatchesWhatIsNotHeld(t *testing.T) {
	b, _, sb := fakeV2Sandbox(t)
	m := &Manager{mode: ModeV2, b: b}
	l := Limits{MemoryBytes: 64 << 20, Pids: 20, CPUQuota: 50 * time.Millisecond}
	if err := m.Ensure("sb", l); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	for file, v := range map[string]string{"memory.max": "max\n", "pids.max": "max\n", "cpu.max": "max 100000\n"} {
		old, _ := os.ReadFile(filepath.Join(sb, file))
		if err := os.WriteFile(filepath.Join(sb, file), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := m.verify("sb", l); !errors.Is(err, ErrNotHeld) {
			t.Errorf("verify with %s = %q: %v, want ErrNotHeld", file, v, err)
		}
		os.WriteFile(filepath.Join(sb, file), old, 0o644)
	}
	if err := m.verify("sb", l); err != nil {
		t.Errorf("verify after restoring: %v", err)
	}
}
