package spritestest

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// killTree SIGKILLs root and every process descended from it by parent
// links, whatever group or session it moved to. Each process found is
// stopped first and the walk repeats until it finds no new one: a
// process killed before its children would orphan them to init, out of
// the walk's reach, and one still running could fork past it.
func killTree(root int) {
	found := map[int]bool{root: true}
	_ = syscall.Kill(root, syscall.SIGSTOP)
	for {
		added := false
		for pid, ppid := range parents() {
			if found[ppid] && !found[pid] {
				found[pid] = true
				added = true
				_ = syscall.Kill(pid, syscall.SIGSTOP)
			}
		}
		if !added {
			break
		}
	}
	for pid := range found {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// parents maps every live pid to its parent's, read from /proc/PID/stat.
func parents() map[int]int {
	m := map[int]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return m
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone since the listing
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses,
		// so the fields start after the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			m[pid] = ppid
		}
	}
	return m
}
