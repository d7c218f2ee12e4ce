// Package ostest holds the looks at the operating system that tests of
// several packages (client, cli, daemon, journal) share: a file a command
// creates to say it started, the bytes waiting in a process's stdin pipe,
// this process's inotify instances.
//
// It reads only: it never signals, writes to or ends a process.
package ostest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// WaitFile polls every 20 ms until path exists; after within it calls
// onTimeout (to release what the test holds) and fails t with msg.
func WaitFile(t testing.TB, path string, within time.Duration, onTimeout func(), msg string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			onTimeout()
			t.Fatal(msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PipeHolds is how many bytes wait in the stdin pipe of process pid
// (read through a second read end of it, never read from).
func PipeHolds(t testing.TB, pid int) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd/0", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// InotifyInstances counts this process's inotify descriptors.
func InotifyInstances(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}
