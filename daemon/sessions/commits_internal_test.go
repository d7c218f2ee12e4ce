package sessions

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// newCommitsHarness opens a registry in a temporary directory holding one
// sandbox and one session of it, recorded as starting.
func newCommitsHarness(t *testing.T) (*deferredCommits, *registry.Registry, registry.Session) {
	t.Helper()
	reg, err := registry.Open(filepath.Join(t.TempDir(), "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	if _, _, err := reg.CreateSandbox(registry.Sandbox{Name: "sb", State: wire.SandboxRunning, CreatedAt: time.Now().UTC(), Workspace: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	ss, err := reg.CreateSession(registry.Session{Sandbox: "sb", ID: "s1", Key: registry.NewID(), State: StateStarting}, func(registry.Sandbox) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return newDeferredCommits(reg, slog.New(slog.NewTextHandler(io.Discard, nil))), reg, ss
}

func running(rec *registry.Session) { rec.State = wire.SessionRunning }

func stateOf(t *testing.T, reg *registry.Registry, ss registry.Session) string {
	t.Helper()
	cur, err := reg.GetSession(ss.Sandbox, ss.ID)
	if err != nil {
		t.Fatal(err)
	}
	return cur.State
}

// TestDeferredCommits checks the invariants deferredCommits documents.
func TestDeferredCommits(t *testing.T) {
	t.Run("pending until landed", func(t *testing.T) {
		d, reg, ss := newCommitsHarness(t)
		defer d.close()
		release := make(chan struct{})
		d.commit(ss, "test", func(rec *registry.Session) {
			<-release // inside the registry's update: the commit is in flight
			running(rec)
		})
		pend := d.pendingFor(ss.Sandbox, ss.ID)
		if len(pend) != 1 {
			t.Fatalf("pending while in flight: got %d, want 1", len(pend))
		}
		select {
		case <-pend[0]:
			t.Fatal("landed channel closed before the commit landed")
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		awaitLanded(pend)
		if got := stateOf(t, reg, ss); got != wire.SessionRunning {
			t.Errorf("state after landed: got %q, want %q", got, wire.SessionRunning)
		}
		if n := len(d.pendingFor(ss.Sandbox, ss.ID)); n != 0 {
			t.Errorf("pending after landed: got %d, want 0", n)
		}
	})
	t.Run("settled sees the commit", func(t *testing.T) {
		d, _, ss := newCommitsHarness(t)
		defer d.close()
		d.commit(ss, "test", running)
		if got := d.settled(ss).State; got != wire.SessionRunning {
			t.Errorf("settled state: got %q, want %q", got, wire.SessionRunning)
		}
	})
	t.Run("another spawn's record is not touched", func(t *testing.T) {
		d, reg, ss := newCommitsHarness(t)
		defer d.close()
		old := ss
		old.Key = registry.NewID() // a previous spawn under the same id
		d.commit(old, "test", running)
		awaitLanded(d.pendingFor(ss.Sandbox, ss.ID))
		if got := stateOf(t, reg, ss); got != StateStarting {
			t.Errorf("state after another spawn's commit: got %q, want %q", got, StateStarting)
		}
	})
	t.Run("close waits for commits in flight", func(t *testing.T) {
		d, reg, ss := newCommitsHarness(t)
		release := make(chan struct{})
		d.commit(ss, "test", func(rec *registry.Session) {
			<-release
			running(rec)
		})
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			d.close()
		}()
		select {
		case <-closed:
			t.Fatal("close returned with a commit in flight")
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		<-closed
		if got := stateOf(t, reg, ss); got != wire.SessionRunning {
			t.Errorf("state after close: got %q, want %q", got, wire.SessionRunning)
		}
	})
	t.Run("after close a commit runs in its caller", func(t *testing.T) {
		d, reg, ss := newCommitsHarness(t)
		d.close()
		d.commit(ss, "test", running)
		if got := stateOf(t, reg, ss); got != wire.SessionRunning {
			t.Errorf("state right after commit: got %q, want %q", got, wire.SessionRunning)
		}
	})
}
