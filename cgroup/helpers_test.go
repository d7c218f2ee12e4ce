package cgroup

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// ensure creates sandbox sb's cgroups with l (or updates them), failing
// t on an error.
func ensure(t *testing.T, m *Manager, sb string, l Limits) {
	t.Helper()
	if err := m.Ensure(sb, l); err != nil {
		t.Fatal(err)
	}
}

// sessionDirs returns the directories of session in sandbox sb, failing
// t on an error.
func sessionDirs(t *testing.T, m *Manager, sb, session string) []string {
	t.Helper()
	dirs, err := m.SessionDirs(sb, session)
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// removeAbsent checks that Remove of a sandbox already removed is
// idempotent: nil.
func removeAbsent(t *testing.T, ctx context.Context, m *Manager, sb string) {
	t.Helper()
	if err := m.Remove(ctx, sb); err != nil {
		t.Fatalf("Remove of an absent cgroup = %v, want nil", err)
	}
}

// removeKilling removes sandbox sb and checks that its session's process
// cmd was ended by SIGKILL, failing t otherwise.
func removeKilling(t *testing.T, ctx context.Context, m *Manager, sb string, cmd *proc) {
	t.Helper()
	if err := m.Remove(ctx, sb); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if ps := cmd.wait(t, 10*time.Second); signalOf(ps) != syscall.SIGKILL {
		t.Fatalf("session process ended %v, want SIGKILL", ps)
	}
}

// checkGone fails t, going on, for each of dirs that still exists after
// op removed it.
func checkGone(t *testing.T, op string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after %s (%v)", d, op, err)
		}
	}
}
