package cgroup

import (
	"fmt"
	"strconv"
	"strings"
)

// held is what the kernel holds of the limits Ensure checks after it
// writes: memory and pids (0: none) and the CPU quota in microseconds
// (-1: none). The CPU weight is not read back: v1 stores it as shares
// (a ratio the kernel keeps exactly within the accepted range).
type held struct {
	memory, pids, quotaUS int64
}

// pageCounterMax is the smallest memory value the kernel reports for "no
// limit": PAGE_COUNTER_MAX pages, which on 4 KiB pages is
// 0x7FFFFFFFFFFFF000 bytes (v1 memory.limit_in_bytes; v2 says "max").
// Anything at or above it is no limit.
const pageCounterMax = 1<<63 - 1<<12

// want is what the kernel should hold after l is written.
func (l Limits) want() held {
	quota, _ := l.quotaPeriod()
	return held{memory: l.MemoryBytes, pids: l.Pids, quotaUS: quota}
}

// parseMemory reads a memory limit file's value ("max", or bytes).
func parseMemory(v string) (int64, error) {
	if v == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse memory limit %q: %w", v, err)
	}
	if n >= pageCounterMax {
		return 0, nil
	}
	return int64(n), nil
}

// parseMax reads "max" (0) or a number.
func parseMax(v string) (int64, error) {
	if v == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %q: %w", v, err)
	}
	return n, nil
}

// parseCPUMax reads v2 cpu.max ("max PERIOD" or "QUOTA PERIOD") as the
// quota in microseconds, -1 for none.
func parseCPUMax(v string) (int64, error) {
	q, _, _ := strings.Cut(v, " ")
	if q == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse cpu.max %q: %w", v, err)
	}
	return n, nil
}

// checkHeld compares what the kernel holds with what was written: a limit
// accepted that the kernel does not hold is an error, never reported as
// enforced.
func checkHeld(got, want held) error {
	switch {
	case got.memory != want.memory:
		return fmt.Errorf("the kernel holds a memory limit of %d bytes (0: none), not the %d written", got.memory, want.memory)
	case got.pids != want.pids:
		return fmt.Errorf("the kernel holds a pids limit of %d (0: none), not the %d written", got.pids, want.pids)
	case got.quotaUS != want.quotaUS:
		return fmt.Errorf("the kernel holds a cpu quota of %dus (-1: none), not the %dus written", got.quotaUS, want.quotaUS)
	}
	return nil
}
