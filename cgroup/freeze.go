package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// CanFreeze says whether Freeze works on this host: nil, or why not
// (ErrNotSupported: no freezer hierarchy under v1, limits unavailable).
func (m *Manager) CanFreeze() error {
	if err := m.b.available(); err != nil {
		return err
	}
	if b, ok := m.b.(*v1); ok && !b.freezer {
		return fmt.Errorf("cgroup v1 freezer not mounted: %w", ErrNotSupported)
	}
	return nil
}

// freezeFiles names sandbox name's freezer files: the one to read
// (state), the one to write (stateFile), and the values that mean
// frozen (read) and thawed (written).
func (m *Manager) freezeFiles(name string) (state, stateFile, frozen, thawed string, err error) {
	switch b := m.b.(type) {
	case *v1:
		rel, err := b.path(name)(cgroup1.Freezer)
		if err != nil {
			return "", "", "", "", err
		}
		stateFile = filepath.Join(b.mount, string(cgroup1.Freezer), rel, "freezer.state")
		return stateFile, stateFile, "FROZEN", "THAWED", nil
	case *v2:
		return filepath.Join(b.dir(name), "cgroup.events"), filepath.Join(b.dir(name), "cgroup.freeze"), "frozen 1", "0", nil
	}
	return "", "", "", "", ErrNotSupported
}

// Thaw thaws sandbox name's cgroup whatever froze it: a runnerd killed
// during a checkpoint never called its thaw, and the sandbox's processes
// (a pod's holder among them) stay stopped until someone does. A cgroup
// that does not exist, or a host without a freezer, has nothing to thaw.
func (m *Manager) Thaw(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if m.CanFreeze() != nil {
		return nil
	}
	_, stateFile, _, thawed, err := m.freezeFiles(name)
	if err != nil {
		return fmt.Errorf("thaw %s: %w", name, err)
	}
	if err := os.WriteFile(stateFile, []byte(thawed), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("thaw %s: %w", name, err)
	}
	return nil
}

// Freeze stops every process in sandbox name's cgroup (the v1 freezer
// controller, or cgroup.freeze under v2) and returns once the kernel
// reports them all frozen; the caller must call thaw (idempotent) as soon
// as it can. A sandbox without a cgroup (ErrNotFound) has nothing to
// freeze. If ctx ends before the freeze completes, the cgroup is thawed
// and the error returned.
func (m *Manager) Freeze(ctx context.Context, name string) (thaw func() error, err error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if err := m.CanFreeze(); err != nil {
		return nil, err
	}
	if err := m.mustExist(name); err != nil {
		return nil, fmt.Errorf("freeze %s: %w", name, err)
	}
	state, stateFile, frozen, thawed, err := m.freezeFiles(name)
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", name, err)
	}
	set := func(v string) error {
		if err := os.WriteFile(stateFile, []byte(v), 0); err != nil {
			return fmt.Errorf("write %s: %w", stateFile, err)
		}
		return nil
	}
	thaw = func() error {
		if err := set(thawed); err != nil {
			return fmt.Errorf("thaw %s: %w", name, err)
		}
		return nil
	}
	want := frozen
	if _, ok := m.b.(*v2); ok {
		err = set("1")
	} else {
		err = set(frozen)
	}
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", name, err)
	}
	// The kernel freezes asynchronously (v1 reads FREEZING, v2's events
	// say frozen 0) until every task has stopped. The v1 freezer can stay
	// FREEZING for good while the cgroup keeps forking (a task forked in
	// the middle of the freeze is missed; the kernel does not retry on its
	// own), so under v1 each poll writes FROZEN again and every
	// v1Refreeze polls the cgroup is thawed and frozen anew, as runc does.
	// TestFreezeForkLoop holds this.
	_, isV1 := m.b.(*v1)
	delay := 100 * time.Microsecond
	for polls := 1; ; polls++ {
		b, err := os.ReadFile(state)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("freeze %s: %w", name, err), thaw())
		}
		if isFrozen(string(b), want) {
			return thaw, nil
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(fmt.Errorf("freeze %s: %w", name, ctx.Err()), thaw())
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Millisecond)
		if !isV1 {
			continue
		}
		if polls%v1Refreeze == 0 {
			if err := thaw(); err != nil {
				return nil, err
			}
			delay = 100 * time.Microsecond
		}
		if err := set(frozen); err != nil {
			return nil, errors.Join(fmt.Errorf("freeze %s: %w", name, err), thaw())
		}
	}
}

// v1Refreeze is how many FREEZING polls (about 80 ms once the backoff
// tops out) pass before a v1 freeze is thawed and retried.
const v1Refreeze = 12

func isFrozen(content, want string) bool {
	for _, line := range strings.Split(content, "\n") {
		if strings.TrimSpace(line) == want {
			return true
		}
	}
	return false
}
