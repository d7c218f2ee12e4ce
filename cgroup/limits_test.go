package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
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

func TestOOMKillsFiles(t *testing.T) {
	write := func(t *testing.T, dir, name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("v2", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "memory.events", "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n")
		got, err := OOMKills([]string{d})
		if err != nil || got != 2 {
			t.Fatalf("OOMKills = %d, %v; want 2, nil", got, err)
		}
	})
	t.Run("v1 among other hierarchies", func(t *testing.T) {
		pids, mem, cpu := t.TempDir(), t.TempDir(), t.TempDir()
		write(t, pids, "pids.max", "max\n")
		write(t, mem, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
		got, err := OOMKills([]string{pids, mem, cpu})
		if err != nil || got != 7 {
			t.Fatalf("OOMKills = %d, %v; want 7, nil", got, err)
		}
	})
	t.Run("no memory controller", func(t *testing.T) {
		got, err := OOMKills([]string{t.TempDir()})
		if !errors.Is(err, ErrNotSupported) {
			t.Fatalf("OOMKills = %d, %v; want ErrNotSupported", got, err)
		}
	})
	t.Run("counter missing", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n")
		if got, err := OOMKills([]string{d}); err == nil {
			t.Fatalf("OOMKills = %d, nil; want an error for a file without oom_kill", got)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		d := t.TempDir()
		write(t, d, "memory.events", "oom_kill many\n")
		if got, err := OOMKills([]string{d}); err == nil {
			t.Fatalf("OOMKills = %d, nil; want a parse error", got)
		}
	})
}
