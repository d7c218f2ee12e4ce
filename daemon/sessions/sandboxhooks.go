package sessions

// What the sandboxes manager asks of a sandbox's sessions
// (sandboxes.Sessions): this manager implements it and is handed to the
// sandboxes manager, so the import arrow runs from here to sandboxes only.
// StopAll is stopping.go's, Dir sessionops.go's, Refresh sessionstate.go's.

import (
	"context"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/wire"
)

// RefuseUncontained refuses to move sandbox name from the host network
// into a namespace while a process of it runs on the host network: it
// would stay outside the namespace and escape the policy.
func (s *Manager) RefuseUncontained(ctx context.Context, name string) error {
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
		n, err := lingering(ctx, s.Dir(ss))
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
func (s *Manager) runningSessions(name string) (int, error) {
	list, err := s.reg.ListSessions(name)
	if err != nil {
		return 0, apierr.Unavailable("read registry: %v", err)
	}
	n := 0
	for _, ss := range list {
		if ss.State == StateStarting {
			n++
			continue
		}
		ss, err := s.Refresh(ss)
		if err != nil {
			return 0, err
		}
		if ss.State == wire.SessionRunning {
			n++
		}
	}
	return n, nil
}

// Forget drops what the manager keeps about destroyed sandbox name: its
// journal budget files and its session counts.
func (s *Manager) Forget(name string) {
	s.removeBudgets(name) // journalcap.go
	s.bookForget(name)    // sessions_cap.go
}
