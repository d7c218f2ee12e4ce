package daemon

// The session cap: a sandbox holds at most Config.MaxSandboxSessions
// sessions, running or ended, until they are deleted. A running session
// costs its shim (about 4 MiB, charged to runnerd's unit, not to the
// sandbox: the shim stays outside the sandbox's cgroup so that it outlives
// its command's OOM kill and reports it), an ended one its journal and
// directory on the state disk; so the cap is what bounds one sandbox's
// cost to runnerd. Without it a sandbox's own commands could start
// sessions through the API (they reach it when the token leaks) or a
// control plane could pile up execs until the host ran out of memory.
//
// The count is taken under the sandbox's lock, which every spawn holds
// from before this check to after its record is committed, so two spawns
// of one sandbox cannot both pass one free place. A re-create of an
// existing id (spawn is idempotent) is never refused.

import (
	"errors"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// sessionCap refuses a new session of sandbox name when it already holds
// Config.MaxSandboxSessions sessions; id is the request's (an existing one
// passes, as a re-create). The caller holds name's lock.
func (s *server) sessionCap(name, id string) error {
	max := s.cfg.MaxSandboxSessions
	if max <= 0 {
		return nil
	}
	n, err := s.reg.CountSessions(name)
	if err != nil {
		return errUnavailable("count sessions: %v", err)
	}
	if n < max {
		return nil
	}
	if _, err := s.reg.GetSession(name, id); err == nil {
		return nil // a re-create: answered as before
	} else if !errors.Is(err, registry.ErrNotFound) {
		return errUnavailable("read session: %v", err)
	}
	return errConflict("%s: sandbox %q holds %d sessions (running or ended) of at most %d (runnerd --sandbox-max-sessions); delete ended ones (DELETE /v1/sandboxes/%s/sessions/{id}), or let --session-retention do it", wire.DetailSessionCap, name, n, max, name)
}
