package sessions

// One session, as the HTTP surface (sessions.go, sessionlist.go,
// sessioncontrol.go, attach.go, streams.go) finds it: looking it up, its
// directories and streams, describing it, and reaching its shim. They take
// a context and plain arguments; the request's incarnation, if it named
// one, travels in the context (scoped). Listing is sessionlist.go's,
// driving a live session sessioncontrol.go's, its state's repair
// sessionstate.go's.

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

func (s *Manager) Dir(ss registry.Session) string {
	return filepath.Join(s.cfg.StateDir, "s", ss.Key)
}

func journalDir(sessionDir string) string { return filepath.Join(sessionDir, "journal") }

func StreamsOf(tty bool) []string {
	if tty {
		return []string{"stdout"}
	}
	return []string{"stdout", "stderr"}
}

func ToWireSession(ss registry.Session) wire.Session {
	st := ss.State
	if st == StateStarting {
		st = wire.SessionRunning
	}
	return wire.Session{
		ID:        ss.ID,
		Sandbox:   ss.Sandbox,
		Argv:      ss.Request.Argv,
		TTY:       ss.Request.TTY,
		State:     st,
		PID:       ss.PID,
		StartedAt: ss.StartedAt,
		Streams:   StreamsOf(ss.Request.TTY),
		Exit:      ss.Exit,
	}
}

// WireSession is ToWireSession plus what only the session's files and shim
// know: the current length of each stream (the exit record's once it
// ended) and, while it runs, the shim's journal write error. Both are best
// effort: a journal or shim that does not answer leaves them out.
func (s *Manager) WireSession(ctx context.Context, ss registry.Session) wire.Session {
	out := ToWireSession(ss)
	if out.Exit != nil {
		out.Lengths = out.Exit.Lengths
		return out
	}
	dir := s.Dir(ss)
	if lengths, err := JournalLengths(dir); err == nil {
		out.Lengths = lengths
	}
	if ss.State == wire.SessionRunning {
		c, sctx, cancel, err := launch.DialFor(ctx, dir, launch.Query)
		defer cancel()
		if err == nil {
			if st, err := c.Status(sctx); err == nil {
				out.WriteError = st.WriteError
			}
			c.Close()
		}
	}
	return out
}

// JournalLengths is the end offset of each stream in the journal of the
// session at dir; a stream whose bounds cannot be read is left out.
func JournalLengths(dir string) (map[string]int64, error) {
	j, err := journal.Open(journalDir(dir))
	if err != nil {
		return nil, err
	}
	defer j.Close()
	lengths := map[string]int64{}
	for _, name := range j.Streams() {
		if _, end, err := j.Bounds(name); err == nil {
			lengths[name] = end
		}
	}
	return lengths, nil
}

// Lookup returns session id of sandbox name: not_found only when
// the registry says the sandbox or the session does not exist, or the
// session belongs to another incarnation than the one ctx names (scoped).
func (s *Manager) Lookup(ctx context.Context, name, id string) (registry.Session, error) {
	if err := sandboxes.ValidName(name); err != nil {
		return registry.Session{}, err
	}
	if err := ValidSessionID(id); err != nil {
		return registry.Session{}, err
	}
	ss, err := s.reg.GetSession(name, id)
	if errors.Is(err, registry.ErrNotFound) {
		if _, serr := s.sbx.Get(name); serr != nil {
			return ss, serr
		}
		return ss, apierr.NotFound("session %q of sandbox %q does not exist", id, name)
	}
	if err != nil {
		return ss, apierr.Unavailable("read registry: %v", err)
	}
	// Session ids are scoped to an incarnation: a session recorded for
	// another one than the caller names is not the caller's.
	// A session recorded without one is not refused on this ground.
	if ss.Incarnation == "" {
		return ss, nil
	}
	return ss, sandboxes.IncarnationIs(ctx, name, ss.Incarnation)
}

// commitPending reports whether a deferred commit for rec's session has
// not landed yet.
func (s *Manager) commitPending(rec registry.Session) bool {
	return len(s.commits.pendingFor(rec.Sandbox, rec.ID)) > 0
}

// startedSince reports whether the session of rec, read as starting, has
// been reported started since: its "running" commit is pending, or landed
// (checked in that order, so one landing in between is seen). Its shim
// then made its journal, so a journal that cannot be read is news; a
// session merely starting may have none yet. Called only when the
// journal could not be opened, so the registry read is rare.
func (s *Manager) startedSince(rec registry.Session) bool {
	if s.commitPending(rec) {
		return true
	}
	cur, err := s.reg.GetSession(rec.Sandbox, rec.ID)
	return err == nil && cur.Key == rec.Key && cur.State != StateStarting
}

// controlShim runs fn against the shim of ss, which the caller looked up
// (one registry read per request). A session that ended (or whose shim
// answers that it did) is command_exited.
func (s *Manager) controlShim(ctx context.Context, ss registry.Session, fn func(ctx context.Context, c *launch.Client) error) error {
	ss, err := s.Refresh(ss)
	if err != nil {
		return err
	}
	if ss.State != wire.SessionRunning && ss.State != StateStarting {
		return apierr.CommandExited()
	}
	c, ctx, cancel, err := launch.DialFor(ctx, s.Dir(ss), launch.Control)
	defer cancel()
	if err == nil {
		err = fn(ctx, c)
		c.Close()
	}
	if err != nil && !errors.Is(err, sessiondir.ErrExited) {
		// The shim may have gone between the status and the call.
		if again, rerr := s.Refresh(ss); rerr == nil && again.State != wire.SessionRunning {
			err = sessiondir.ErrExited
		}
	}
	return err
}
