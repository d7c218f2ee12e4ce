package cgroup

import (
	"strings"
	"testing"
)

func TestFavorDynMods(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo string
		on, known       bool
	}{
		{"hybrid, off", "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n" +
			"42 31 0:39 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n", false, true},
		{"hybrid, on", "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,favordynmods\n", true, true},
		{"v2 with optional fields, on", "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate,favordynmods,memory_recursiveprot\n", true, true},
		{"a path that says favordynmods is not the option", "41 31 0:38 / /favordynmods rw - cgroup2 cgroup2 rw\n", false, true},
		{"no cgroup2", "42 31 0:39 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n", false, false},
	} {
		on, known := favorDynMods(strings.NewReader(tc.mountinfo))
		if on != tc.on || known != tc.known {
			t.Errorf("%s: got on %v known %v, want %v %v", tc.name, on, known, tc.on, tc.known)
		}
	}
}
