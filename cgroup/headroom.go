package cgroup

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Headroom is what the sandboxes' root cgroup (Config.Root) leaves under
// its limits: the tightest of the root's own and every ancestor's, in each
// hierarchy, of limit minus what is charged there now. A resource no level
// limits is not Limited, and its Free is meaningless (the caller reports
// the host's figure instead).
type Headroom struct {
	MemoryLimited bool
	MemoryFree    int64 // bytes; 0 when the usage reached the limit
	PidsLimited   bool
	PidsFree      int64 // tasks
}

// v1 writes "no limit" as the largest page-aligned int64; anything this
// large is no limit.
const v1Unlimited = math.MaxInt64 / 2

// RootHeadroom reads Headroom from the cgroup filesystem.
func (m *Manager) RootHeadroom() (Headroom, error) {
	var h Headroom
	for _, dir := range m.b.rootDirs() {
		for d := dir; ; d = filepath.Dir(d) {
			var err error
			if m.mode == ModeV2 {
				err = h.level(d, "memory.max", "memory.current", "pids.max", "pids.current")
			} else {
				err = h.level(d, "memory.limit_in_bytes", "memory.usage_in_bytes", "pids.max", "pids.current")
			}
			if errors.Is(err, errNoLevel) || d == "/" || d == "." {
				break
			}
			if err != nil {
				return Headroom{}, err
			}
		}
	}
	return h, nil
}

// errNoLevel is returned by level for a directory holding none of the
// files: above the hierarchy's mount.
var errNoLevel = errors.New("not a cgroup directory")

// level folds one directory's limits into h.
func (h *Headroom) level(dir, memMax, memCur, pidsMax, pidsCur string) error {
	found := false
	for _, r := range []struct {
		max, cur string
		limited  *bool
		free     *int64
	}{
		{memMax, memCur, &h.MemoryLimited, &h.MemoryFree},
		{pidsMax, pidsCur, &h.PidsLimited, &h.PidsFree},
	} {
		lim, ok, err := readLimit(filepath.Join(dir, r.max))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		found = true
		if !ok {
			continue
		}
		cur, _, err := readLimit(filepath.Join(dir, r.cur))
		if err != nil {
			return err
		}
		free := max(0, lim-cur)
		if !*r.limited || free < *r.free {
			*r.limited, *r.free = true, free
		}
	}
	if !found {
		return errNoLevel
	}
	return nil
}

// readLimit reads a cgroup number; ok is false for "max" (v2) or v1's
// "unlimited".
func readLimit(path string) (n int64, ok bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false, nil
	}
	n, err = strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s %q: %w", path, s, err)
	}
	return n, n < v1Unlimited, nil
}
