package daemon

// What the sandboxes manager asks of a sandbox's sessions
// (sandboxes.Sessions): the session side implements it and hands it to
// the manager, so the import arrow runs from here to sandboxes only.

import (
	"context"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/wire"
)

// refuseUncontained refuses to move sandbox name from the host network
// into a namespace while a process of it runs on the host network: it
// would stay outside the namespace and escape the policy.
func (s *server) refuseUncontained(ctx context.Context, name string) error {
	n, err := s.runningSessions(name)
	if err != nil {
		return err
	}
	if n > 0 {
		return apierr.Conflict("sandbox %q has %d running session(s) on the host network that the policy could not contain: terminate or suspend them first", name, n)
	}
	// So would a process that outlived its command (a background
	// server): its shim keeps it until it ends or is terminated.
	list, err := s.reg.ListSessions(name)
	if err != nil {
		return apierr.Unavailable("read registry: %v", err)
	}
	for _, ss := range list {
		n, err := lingering(ctx, s.sessionDir(ss))
		if err != nil {
			return apierr.Unavailable("%v", err)
		}
		if n > 0 {
			return apierr.Conflict("sandbox %q: session %s has %d process(es) on the host network that outlived its command and that the policy could not contain: terminate the session or suspend the sandbox first", name, ss.ID, n)
		}
	}
	return nil
}

// runningSessions counts the sessions of a sandbox that run (or start).
func (s *server) runningSessions(name string) (int, error) {
	list, err := s.reg.ListSessions(name)
	if err != nil {
		return 0, apierr.Unavailable("read registry: %v", err)
	}
	n := 0
	for _, ss := range list {
		if ss.State == stateStarting {
			n++
			continue
		}
		ss, err := s.refresh(ss)
		if err != nil {
			return 0, err
		}
		if ss.State == wire.SessionRunning {
			n++
		}
	}
	return n, nil
}

// sandboxSessions is the session side as the sandboxes manager sees it.
type sandboxSessions struct{ s *server }

var _ sandboxes.Sessions = sandboxSessions{}

func (h sandboxSessions) StopAll(ctx context.Context, name string, grace time.Duration) ([]registry.Session, error) {
	return h.s.stopSandboxSessions(ctx, name, grace) // stopping.go
}

func (h sandboxSessions) Dir(ss registry.Session) string { return h.s.sessionDir(ss) }

func (h sandboxSessions) RefuseUncontained(ctx context.Context, name string) error {
	return h.s.refuseUncontained(ctx, name)
}

func (h sandboxSessions) Refresh(ss registry.Session) (registry.Session, error) {
	return h.s.refresh(ss) // sessionstate.go
}

func (h sandboxSessions) Forget(name string) {
	h.s.removeBudgets(name) // journalcap.go
	h.s.bookForget(name)    // sessions_cap.go
}
