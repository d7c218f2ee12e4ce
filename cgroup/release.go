package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/cgroup/oom"
)

// A session's leaf outlives its command only as long as something the
// command started still runs in it: ReleaseSession removes an empty leaf
// without killing anything, so that a sandbox whose ended sessions are
// kept (for their journals) does not keep a cgroup per session too, each
// of which pins kernel memory (a memory cgroup, and per-CPU state) until
// it is removed.

// leafDirs returns the directories of the cgroup at elems, one per
// hierarchy, without creating anything.
func (m *Manager) leafDirs(elems ...string) ([]string, error) {
	switch b := m.b.(type) {
	case *v1:
		return b.dirs(elems...)
	case *v2:
		return []string{b.dir(elems...)}, nil
	}
	return nil, fmt.Errorf("leaf directories: unknown layout: %w", ErrNotSupported)
}

// Sessions returns the names of sandbox name's session leaves (none when
// its cgroup does not exist).
func (m *Manager) Sessions(name string) ([]string, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	dirs, err := m.leafDirs(name)
	if err != nil {
		return nil, err
	}
	return listDirs(dirs[0]) // every hierarchy holds the same names
}

// ReleaseSession removes session's leaf of sandbox name if no process is
// in it in any hierarchy, and kills nothing: a leaf that still holds a
// process (a background job the command left) is kept, released is
// false. A leaf already gone is released. kills is the number of OOM
// kills the sandbox's Usage stops counting with it: under v1 a kill is
// counted only in the victim's own memory cgroup (Usage adds the leaves
// that exist), so the caller must keep that count to keep Usage's total;
// under v2 the sandbox's own memory.events counts it, and kills is 0.
func (m *Manager) ReleaseSession(name, session string) (kills uint64, released bool, err error) {
	if err := validName(name); err != nil {
		return 0, false, err
	}
	if err := validName(session); err != nil {
		return 0, false, err
	}
	dirs, err := m.leafDirs(name, session)
	if err != nil {
		return 0, false, err
	}
	var present []string
	for _, d := range dirs {
		busy := false
		if err := walkProcs(d, func(int) { busy = true }); err != nil {
			return 0, false, err
		}
		if busy {
			return 0, false, nil
		}
		if _, err := os.Stat(d); err == nil {
			present = append(present, d)
		}
	}
	if len(present) == 0 {
		return 0, true, nil
	}
	if m.mode == ModeV1 {
		n, err := oom.Kills(present)
		switch {
		case errors.Is(err, oom.ErrNotSupported):
		case err != nil:
			return 0, false, fmt.Errorf("release session cgroup %s/%s: %w", name, session, err)
		default:
			kills = n
		}
	}
	// The memory directory goes last under v1 (dirs lists it first), so
	// a leaf whose other directories went keeps its count readable until
	// the end.
	for i := len(present) - 1; i >= 0; i-- {
		err := unix.Rmdir(present[i])
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOTEMPTY):
			// A process (or a child cgroup) appeared: kept. What went
			// already is recreated by a later SessionDirs if needed.
			return 0, false, nil
		default:
			return 0, false, fmt.Errorf("release session cgroup %s: %w", filepath.Base(present[i]), err)
		}
	}
	return kills, true, nil
}
