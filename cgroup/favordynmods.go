package cgroup

import (
	"bufio"
	"io"
	"os"
	"slices"
	"strings"
)

// FavorDynMods reports whether the host's cgroup v2 hierarchy is mounted
// with favordynmods (known false where there is no cgroup2 mount). The
// option makes the kernel's cgroup migration lock cheap to take after an
// idle spell (a migration otherwise waits an RCU grace period, 7–14 ms:
// docs/cgroups.md), at a small cost to every fork and exit; the lock is
// global, so v1 migrations on a hybrid host gain too. It is the
// operator's choice (a mount option, or cgroup_favordynmods=true at
// boot); runnerd only reports it. What it reads is the mount line: a
// remount without the option drops the word while, on some kernels, the
// fast lock stays until reboot (so "off" can understate).
func FavorDynMods() (on, known bool) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, false
	}
	defer f.Close()
	return favorDynMods(f)
}

// favorDynMods reads mountinfo lines: "... mountpoint opts [optional] -
// fstype source superopts"; favordynmods is a super option of cgroup2.
func favorDynMods(r io.Reader) (on, known bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		_, after, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f := strings.Fields(after)
		if len(f) < 3 || f[0] != "cgroup2" {
			continue
		}
		known = true
		if slices.Contains(strings.Split(f[2], ","), "favordynmods") {
			return true, true
		}
	}
	return false, known
}
