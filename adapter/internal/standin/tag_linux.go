package standin

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// KillTagged SIGKILLs every process whose environment carries the exact
// entry name=id (the processes a stand-in started for sandbox id, and what
// they started, runner-shim's detached sessions included), by pid, and
// waits until none is left (a bounded number of sweeps: a process may fork
// while it is being swept).
func KillTagged(name, id string) {
	for range 50 {
		if SignalTagged(name, id, syscall.SIGKILL) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StopTagged SIGSTOPs every process tagged name=id and sweeps again until
// every one is stopped (a bounded number of sweeps), as a paused VM
// freezes everything in it; ContinueTagged SIGCONTs them.
func StopTagged(name, id string) {
	for range 50 {
		if SignalTagged(name, id, syscall.SIGSTOP) == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ContinueTagged SIGCONTs every process tagged name=id.
func ContinueTagged(name, id string) {
	tagged(name, id, true, func(pid int) { syscall.Kill(pid, syscall.SIGCONT) })
}

// SignalTagged sends sig to every live process tagged name=id (zombies,
// and for SIGSTOP processes already stopped, are left out) and returns
// how many it signalled.
func SignalTagged(name, id string, sig syscall.Signal) int {
	return tagged(name, id, sig != syscall.SIGSTOP, func(pid int) { syscall.Kill(pid, sig) })
}

// tagged calls fn for every process whose environment carries the exact
// entry name=id, skipping zombies and, unless withStopped, stopped
// processes, and returns how many it called fn for.
func tagged(name, id string, withStopped bool, fn func(pid int)) int {
	tag := []byte(name + "=" + id + "\x00")
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		// The leading NUL anchors the match at an entry's start, so
		// X_name=id never matches name=id; the trailing one anchors its end.
		if err != nil || !bytes.Contains(append([]byte{0}, env...), append([]byte{0}, tag...)) {
			continue
		}
		// A zombie keeps its environ readable only while it is not
		// reaped; its parent (a shim, or init) reaps it.
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err == nil && (bytes.Contains(st, []byte(") Z ")) || !withStopped && bytes.Contains(st, []byte(") T "))) {
			continue
		}
		n++
		fn(pid)
	}
	return n
}
