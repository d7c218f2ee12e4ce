// Package oom reads how many processes the kernel killed for memory in a
// cgroup, from the cgroup's files alone.
//
// It is the one piece of cgroup handling the shim needs (at its command's
// exit, to report oom_killed), so it imports only the standard library: a
// main that imports it grows by about 0.2 MB, where importing package
// cgroup (containerd's library with protobuf, cilium/ebpf, dbus, logrus)
// adds about 7.5 MB. deps_test.go holds it to the standard library.
package oom

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// ErrNotSupported is returned when no directory given has a memory
// controller's kill counter, so a kill could not have been seen.
var ErrNotSupported = errors.New("not supported")

// Kills returns how many processes the kernel killed for memory in the
// cgroup directories dirs (as returned by cgroup.Manager.SessionDirs: one v2
// directory, or one per v1 hierarchy). It reads `oom_kill` from v2's
// memory.events or v1's memory.oom_control in whichever of dirs has one,
// and sums them (only the memory directory has one). It returns an error
// wrapping ErrNotSupported when none of dirs has a memory controller, so
// "no kill" is never reported where kills cannot be seen.
func Kills(dirs []string) (uint64, error) {
	var total uint64
	found := false
	for _, dir := range dirs {
		for _, name := range []string{"memory.events", "memory.oom_control"} {
			n, err := ReadKey(filepath.Join(dir, name), "oom_kill")
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return 0, err
			}
			total += n
			found = true
			break
		}
	}
	if !found {
		return 0, fmt.Errorf("count oom kills in %v: no memory controller: %w", dirs, ErrNotSupported)
	}
	return total, nil
}

// ReadKey returns the value of key in a flat-keyed cgroup file ("key value"
// lines, as memory.events, memory.oom_control, pids.events). A file
// without the key (a kernel before 4.13 for v1's oom_kill) is an error
// wrapping ErrNotSupported: a missing counter is not a zero.
func ReadKey(path, key string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte{' '})
		if !ok || string(k) != key {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s in %s: %w", key, path, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("read %s: no %s counter: %w", path, key, ErrNotSupported)
}
