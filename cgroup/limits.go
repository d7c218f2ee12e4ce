package cgroup

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// Errors a Manager returns, matched with errors.Is.
var (
	// ErrInvalid is returned for limits out of range and for sandbox or
	// session names that are not one plain path element; the daemon maps
	// it to 400 invalid.
	ErrInvalid = errors.New("invalid")
	// ErrNotSupported is returned when limits or usage are asked for where
	// they cannot be enforced or read (see Manager.Available).
	ErrNotSupported = errors.New("not supported")
	// ErrNotHeld is returned by Ensure and Update when the limits read
	// back from the kernel after writing are not the ones written (a
	// value it rounded, clamped or did not take): the cgroup then holds
	// something other than what was asked, which the caller must not
	// report as enforced.
	ErrNotHeld = errors.New("limits not held by the kernel")
	// ErrNotFound is returned by Update, Usage and SessionDirs for a
	// sandbox whose cgroup does not exist.
	ErrNotFound = errors.New("not found")
)

// Bounds of the limits, the kernel's where it has one. A value the
// kernel would refuse, round or clamp is refused by Validate before
// anything is written, so a limit accepted is the limit the kernel holds.
const (
	// MinMemoryBytes is the smallest memory limit accepted: below it a
	// shell cannot even start, so a smaller value is a mistake.
	MinMemoryBytes = 1 << 20
	// MaxMemoryBytes is the largest memory limit accepted. The kernel
	// stores a limit in pages up to PAGE_COUNTER_MAX and silently turns
	// anything above it into "no limit" (v1 memory.limit_in_bytes, v2
	// memory.max); 4 EiB is well below that on every page size. A memory
	// limit must also be a whole number of pages (os.Getpagesize): the
	// kernel rounds any other value down.
	MaxMemoryBytes = 1 << 62
	// MaxPids is the largest pids limit the kernel accepts: PID_MAX_LIMIT
	// on a 64-bit kernel (pids.max answers EINVAL above it, v1 and v2).
	MaxPids = 4 << 20
	// MaxCPUQuota is the largest quota per period the kernel accepts
	// (max_cfs_runtime, 2^44-1 microseconds: cpu.cfs_quota_us and cpu.max
	// answer EINVAL above it).
	MaxCPUQuota = (1<<44 - 1) * time.Microsecond
	// MaxCPUWeight and MinCPUWeight bound CPUWeight (cgroup v2 cpu.weight).
	MinCPUWeight = 1
	MaxCPUWeight = 10000
	// DefaultCPUWeight is the kernel's default weight (cpu.weight 100,
	// cpu.shares 1024).
	DefaultCPUWeight = 100
	// MinCPUPeriod and MaxCPUPeriod bound CPUPeriod (the kernel's range
	// for cpu.cfs_period_us and cpu.max).
	MinCPUPeriod = time.Millisecond
	MaxCPUPeriod = time.Second
	// DefaultCPUPeriod is used when CPUQuota is set without CPUPeriod.
	DefaultCPUPeriod = 100 * time.Millisecond
	// MinCPUQuota is the kernel's smallest quota per period.
	MinCPUQuota = time.Millisecond
)

// Limits bound one sandbox. The zero value of a field means "no limit"
// (the kernel's default), so the zero Limits is no limit at all and is
// accepted even where limits cannot be enforced.
type Limits struct {
	// MemoryBytes caps the sandbox's memory (RSS and page cache, and swap:
	// the sandbox gets none beyond it). 0 is unlimited; otherwise at least
	// MinMemoryBytes.
	MemoryBytes int64
	// Pids caps the number of tasks (processes and threads) in the
	// sandbox. 0 is unlimited; otherwise at least 1.
	Pids int64
	// CPUWeight is the sandbox's share of contended CPU, in cgroup v2
	// cpu.weight units (1..10000, default 100). Under v1 it is written as
	// cpu.shares = weight*1024/100, which keeps the default at the
	// kernel's default and the ratios between sandboxes exact. 0 is the
	// default.
	CPUWeight uint64
	// CPUQuota is the CPU time the sandbox may use per CPUPeriod (2×period
	// is two full cores). 0 is unlimited; otherwise at least MinCPUQuota.
	CPUQuota time.Duration
	// CPUPeriod is the accounting period of CPUQuota; 0 means
	// DefaultCPUPeriod. It is meaningless, and refused, without CPUQuota.
	CPUPeriod time.Duration
}

// Zero reports whether l sets no limit at all.
func (l Limits) Zero() bool { return l == Limits{} }

// Validate returns an error wrapping ErrInvalid naming the first field out
// of range, or nil.
func (l Limits) Validate() error {
	switch {
	case l.MemoryBytes < 0:
		return fmt.Errorf("memory %d: negative: %w", l.MemoryBytes, ErrInvalid)
	case l.MemoryBytes > 0 && l.MemoryBytes < MinMemoryBytes:
		return fmt.Errorf("memory %d: below the minimum %d bytes: %w", l.MemoryBytes, MinMemoryBytes, ErrInvalid)
	case l.MemoryBytes > MaxMemoryBytes:
		return fmt.Errorf("memory %d: above the maximum %d bytes: %w", l.MemoryBytes, int64(MaxMemoryBytes), ErrInvalid)
	case l.MemoryBytes%int64(os.Getpagesize()) != 0:
		return fmt.Errorf("memory %d: not a whole number of %d-byte pages (the kernel would round it down): %w", l.MemoryBytes, os.Getpagesize(), ErrInvalid)
	case l.Pids < 0:
		return fmt.Errorf("pids %d: negative: %w", l.Pids, ErrInvalid)
	case l.Pids > MaxPids:
		return fmt.Errorf("pids %d: above the kernel's maximum %d: %w", l.Pids, MaxPids, ErrInvalid)
	case l.CPUWeight != 0 && (l.CPUWeight < MinCPUWeight || l.CPUWeight > MaxCPUWeight):
		return fmt.Errorf("cpu weight %d: outside %d..%d: %w", l.CPUWeight, MinCPUWeight, MaxCPUWeight, ErrInvalid)
	case l.CPUQuota < 0:
		return fmt.Errorf("cpu quota %v: negative: %w", l.CPUQuota, ErrInvalid)
	case l.CPUQuota > 0 && l.CPUQuota < MinCPUQuota:
		return fmt.Errorf("cpu quota %v: below the minimum %v: %w", l.CPUQuota, MinCPUQuota, ErrInvalid)
	case l.CPUQuota > MaxCPUQuota:
		return fmt.Errorf("cpu quota %dus: above the kernel's maximum %dus: %w", l.CPUQuota.Microseconds(), MaxCPUQuota.Microseconds(), ErrInvalid)
	case l.CPUQuota%time.Microsecond != 0:
		return fmt.Errorf("cpu quota %v: not a whole number of microseconds: %w", l.CPUQuota, ErrInvalid)
	case l.CPUPeriod != 0 && l.CPUQuota == 0:
		return fmt.Errorf("cpu period %v without a quota: %w", l.CPUPeriod, ErrInvalid)
	case l.CPUPeriod != 0 && (l.CPUPeriod < MinCPUPeriod || l.CPUPeriod > MaxCPUPeriod):
		return fmt.Errorf("cpu period %v: outside %v..%v: %w", l.CPUPeriod, MinCPUPeriod, MaxCPUPeriod, ErrInvalid)
	case l.CPUPeriod%time.Microsecond != 0:
		return fmt.Errorf("cpu period %v: not a whole number of microseconds: %w", l.CPUPeriod, ErrInvalid)
	}
	return nil
}

// weight is the effective cpu.weight.
func (l Limits) weight() uint64 {
	if l.CPUWeight == 0 {
		return DefaultCPUWeight
	}
	return l.CPUWeight
}

// shares is the v1 cpu.shares for the weight; see CPUWeight.
func (l Limits) shares() uint64 { return l.weight() * 1024 / DefaultCPUWeight }

// quotaPeriod is the quota (-1 for none) and period in microseconds.
func (l Limits) quotaPeriod() (int64, uint64) {
	period := l.CPUPeriod
	if period == 0 {
		period = DefaultCPUPeriod
	}
	quota := int64(-1)
	if l.CPUQuota > 0 {
		quota = l.CPUQuota.Microseconds()
	}
	return quota, uint64(period.Microseconds())
}

// Usage is what a sandbox's cgroup has consumed.
type Usage struct {
	// MemoryBytes is the memory charged now; MemoryPeakBytes the most
	// ever charged since the cgroup was created.
	MemoryBytes, MemoryPeakBytes uint64
	// CPUTime is the CPU time used by every process that ever ran in it.
	CPUTime time.Duration
	// Pids is the number of tasks now.
	Pids uint64
	// OOMKills counts the processes the kernel killed for memory.
	OOMKills uint64
}
