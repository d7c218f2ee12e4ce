package e2b_test

import (
	"bytes"
	"fmt"
	"os"
	"time"
)

// running reports whether pid is a live process (not gone, not a zombie
// waiting for its reaper), waiting up to 2s for it to end.
func running(pid int) bool {
	for range 200 {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || bytes.Contains(st, []byte(") Z ")) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
