package cgroup

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/agentrunner/runner/cgroup/oom"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limits
		ok   bool
	}{
		{"zero", Limits{}, true},
		{"all set", Limits{MemoryBytes: 64 << 20, Pids: 100, CPUWeight: 500, CPUQuota: 50 * time.Millisecond, CPUPeriod: 100 * time.Millisecond}, true},
		{"memory at minimum", Limits{MemoryBytes: MinMemoryBytes}, true},
		{"memory below minimum", Limits{MemoryBytes: MinMemoryBytes - 1}, false},
		{"memory negative", Limits{MemoryBytes: -1}, false},
		{"pids negative", Limits{Pids: -5}, false},
		{"pids one", Limits{Pids: 1}, true},
		{"pids at the kernel's maximum", Limits{Pids: MaxPids}, true},
		{"pids above the kernel's maximum", Limits{Pids: MaxPids + 1}, false},
		{"pids 2^62", Limits{Pids: 1 << 62}, false},
		{"memory not whole pages", Limits{MemoryBytes: MinMemoryBytes + 1}, false},
		{"memory at maximum", Limits{MemoryBytes: MaxMemoryBytes}, true},
		{"memory above maximum", Limits{MemoryBytes: MaxMemoryBytes + int64(os.Getpagesize())}, false},
		{"quota at the kernel's maximum", Limits{CPUQuota: MaxCPUQuota}, true},
		{"quota above the kernel's maximum", Limits{CPUQuota: MaxCPUQuota + time.Microsecond}, false},
		{"weight at bounds", Limits{CPUWeight: MaxCPUWeight}, true},
		{"weight above max", Limits{CPUWeight: MaxCPUWeight + 1}, false},
		{"quota negative", Limits{CPUQuota: -time.Millisecond}, false},
		{"quota below minimum", Limits{CPUQuota: 999 * time.Microsecond}, false},
		{"quota sub-microsecond", Limits{CPUQuota: time.Millisecond + 1}, false},
		{"quota above period", Limits{CPUQuota: 2 * time.Second, CPUPeriod: time.Second}, true},
		{"period without quota", Limits{CPUPeriod: 100 * time.Millisecond}, false},
		{"period too short", Limits{CPUQuota: 10 * time.Millisecond, CPUPeriod: 999 * time.Microsecond}, false},
		{"period too long", Limits{CPUQuota: 10 * time.Millisecond, CPUPeriod: time.Second + time.Microsecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if tc.ok && err != nil {
				t.Fatalf("Validate(%+v) = %v, want nil", tc.l, err)
			}
			if !tc.ok && !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate(%+v) = %v, want ErrInvalid", tc.l, err)
			}
		})
	}
}

func TestShares(t *testing.T) {
	for _, tc := range []struct{ weight, shares uint64 }{
		{0, 1024}, {DefaultCPUWeight, 1024}, {1, 10}, {200, 2048}, {MaxCPUWeight, 102400},
	} {
		if got := (Limits{CPUWeight: tc.weight}).shares(); got != tc.shares {
			t.Errorf("shares of weight %d = %d, want %d", tc.weight, got, tc.shares)
		}
	}
}

func TestOOMKillsWrapsNotSupported(t *testing.T) {
	n, err := OOMKills([]string{t.TempDir()})
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, oom.ErrNotSupported) {
		t.Fatalf("OOMKills of a directory without memory files = %d, %v; want cgroup.ErrNotSupported and oom.ErrNotSupported", n, err)
	}
}
