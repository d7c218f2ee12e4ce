package cgroup

import (
	"errors"
	"fmt"

	"github.com/agentrunner/runner/cgroup/oom"
)

// OOMKills returns how many processes the kernel killed for memory in the
// cgroup directories dirs (as SessionDirs returns them), from the memory
// controller's files; an error wrapping ErrNotSupported when none of dirs
// has one. It is oom.Kills, which a process that needs only this (the
// shim) should import instead: package oom is standard-library only.
func OOMKills(dirs []string) (uint64, error) {
	n, err := oom.Kills(dirs)
	if errors.Is(err, oom.ErrNotSupported) {
		return 0, fmt.Errorf("%w: %w", err, ErrNotSupported)
	}
	return n, err
}
