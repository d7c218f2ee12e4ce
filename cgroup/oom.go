package cgroup

// This file imports only the standard library on purpose: OOMKills is what
// the shim needs at its command's exit, and reading two small files must not
// cost it the cgroup library. Keep it that way.

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

// OOMKills returns how many processes the kernel killed for memory in the
// cgroup directories dirs (as returned by Manager.SessionDirs: one v2
// directory, or one per v1 hierarchy). It reads `oom_kill` from v2's
// memory.events or v1's memory.oom_control in whichever of dirs has one,
// and sums them (only the memory directory has one). It returns an error
// wrapping ErrNotSupported when none of dirs has a memory controller, so
// "no kill" is never reported where kills cannot be seen.
func OOMKills(dirs []string) (uint64, error) {
	var total uint64
	found := false
	for _, dir := range dirs {
		for _, name := range []string{"memory.events", "memory.oom_control"} {
			n, err := readKey(filepath.Join(dir, name), "oom_kill")
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

// readKey returns the value of key in a flat-keyed cgroup file ("key value"
// lines). A file without the key (a kernel before 4.13 for v1's oom_kill)
// is an error: a missing counter is not a zero.
func readKey(path, key string) (uint64, error) {
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
