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
	tag := []byte(name + "=" + id + "\x00")
	for range 50 {
		found := false
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
			if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && bytes.Contains(st, []byte(") Z ")) {
				continue
			}
			found = true
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if !found {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
