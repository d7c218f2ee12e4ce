package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// memory is a process's private memory from /proc/PID/smaps_rollup, in
// bytes.
type memory struct {
	Pss, PrivateDirty, PrivateClean, Rss int64
}

func (m memory) add(o memory) memory {
	return memory{m.Pss + o.Pss, m.PrivateDirty + o.PrivateDirty, m.PrivateClean + o.PrivateClean, m.Rss + o.Rss}
}

func (m memory) sub(o memory) memory {
	return memory{m.Pss - o.Pss, m.PrivateDirty - o.PrivateDirty, m.PrivateClean - o.PrivateClean, m.Rss - o.Rss}
}

func readMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "Pss":
			m.Pss = n << 10
		case "Private_Dirty":
			m.PrivateDirty = n << 10
		case "Private_Clean":
			m.PrivateClean = n << 10
		case "Rss":
			m.Rss = n << 10
		}
	}
	return m, nil
}

// cpuTime is a process's user+system CPU time from /proc/PID/stat.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it are fixed.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// selfCPU is the harness's own CPU time (the client side).
func selfCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// shimPIDs maps session id to the pid of its live shim, from the session
// directories under STATE/s (spec.json names the session; shim.pid its
// shim). Only shims that are still running are returned; a warm shim's
// staging directory (no spec.json yet) is no session.
func shimPIDs(state string) (map[string]int, error) {
	dirs, err := filepath.Glob(filepath.Join(state, "s", "*"))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "shim.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || syscall.Kill(pid, 0) != nil {
			continue
		}
		var spec struct{ ID string }
		b, err = os.ReadFile(filepath.Join(d, "spec.json"))
		if err != nil || json.Unmarshal(b, &spec) != nil {
			continue
		}
		out[spec.ID] = pid
	}
	return out, nil
}

// children returns the pids whose parent is pid.
func children(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}
