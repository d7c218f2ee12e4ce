package daemon

// Session operations the HTTP surface (sessions.go, attach.go, streams.go)
// calls: looking a session up, describing it, and driving a live one
// through its shim. They take a context and plain arguments; the request's
// incarnation, if it named one, travels in the context (scoped).

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

func (s *server) sessionDir(ss registry.Session) string {
	return filepath.Join(s.cfg.StateDir, "s", ss.Key)
}

func journalDir(sessionDir string) string { return filepath.Join(sessionDir, "journal") }

func streamsOf(tty bool) []string {
	if tty {
		return []string{"stdout"}
	}
	return []string{"stdout", "stderr"}
}

func toWireSession(ss registry.Session) wire.Session {
	st := ss.State
	if st == stateStarting {
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
		Streams:   streamsOf(ss.Request.TTY),
		Exit:      ss.Exit,
	}
}

// wireSession is toWireSession plus what only the session's files and shim
// know: the current length of each stream (the exit record's once it
// ended) and, while it runs, the shim's journal write error. Both are best
// effort: a journal or shim that does not answer leaves them out.
func (s *server) wireSession(ctx context.Context, ss registry.Session) wire.Session {
	out := toWireSession(ss)
	if out.Exit != nil {
		out.Lengths = out.Exit.Lengths
		return out
	}
	dir := s.sessionDir(ss)
	if lengths, err := journalLengths(dir); err == nil {
		out.Lengths = lengths
	}
	if ss.State == wire.SessionRunning {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if c, err := shim.Dial(sctx, dir); err == nil {
			if st, err := c.Status(sctx); err == nil {
				out.WriteError = st.WriteError
			}
			c.Close()
		}
	}
	return out
}

// journalLengths is the end offset of each stream in the journal of the
// session at dir; a stream whose bounds cannot be read is left out.
func journalLengths(dir string) (map[string]int64, error) {
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

// lookupSession returns session id of sandbox name: not_found only when
// the registry says the sandbox or the session does not exist, or the
// session belongs to another incarnation than the one ctx names (scoped).
func (s *server) lookupSession(ctx context.Context, name, id string) (registry.Session, error) {
	if err := validName(name); err != nil {
		return registry.Session{}, err
	}
	if err := validSessionID(id); err != nil {
		return registry.Session{}, err
	}
	ss, err := s.reg.GetSession(name, id)
	if errors.Is(err, registry.ErrNotFound) {
		if _, serr := s.sandbox(name); serr != nil {
			return ss, serr
		}
		return ss, errNotFound("session %q of sandbox %q does not exist", id, name)
	}
	if err != nil {
		return ss, errUnavailable("read registry: %v", err)
	}
	// Session ids are scoped to an incarnation: a session recorded for
	// another one than the caller names is not the caller's.
	// A session recorded without one is not refused on this ground.
	if ss.Incarnation == "" {
		return ss, nil
	}
	return ss, incarnationIs(ctx, name, ss.Incarnation)
}

// listSessions describes every session of sandbox name, each refreshed
// from its shim. One that cannot be refreshed is listed as last recorded,
// with a status_error.
func (s *server) listSessions(ctx context.Context, name string) (wire.SessionList, error) {
	if _, err := s.sandbox(name); err != nil {
		return wire.SessionList{}, err
	}
	list, err := s.reg.ListSessions(name)
	if err != nil {
		return wire.SessionList{}, errUnavailable("read registry: %v", err)
	}
	out := wire.SessionList{Sessions: make([]wire.Session, 0, len(list))}
	for _, rec := range list {
		ss, err := s.refresh(rec)
		if err != nil {
			// One unreadable session does not hide the others: it is
			// listed as last recorded, and says so.
			ws := toWireSession(rec)
			ws.StatusError = statusDetail(err)
			s.log.Warn("list sessions: refresh", "sandbox", rec.Sandbox, "session", rec.ID, "err", err)
			out.Sessions = append(out.Sessions, ws)
			continue
		}
		out.Sessions = append(out.Sessions, s.wireSession(ctx, ss))
	}
	return out, nil
}

// statusDetail is what a listed session's status_error says: an API
// error's detail, any other error's text.
func statusDetail(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.detail
	}
	return err.Error()
}

// stdinSession looks up session id of sandbox name for a stdin write. An
// exit recorded after the answer that reported it (deferredCommits) is
// waited for, so a client that saw the exit gets command_exited; so does
// any session that has ended.
//
// The wait covers a record that still says starting as well as running:
// an exec is answered with both its "running" commit (spawn) and its exit
// commit pending, so a stdin write right after that answer can read the
// record before either landed. Only an ended record needs no wait.
func (s *server) stdinSession(ctx context.Context, name, id string) (registry.Session, error) {
	pend := s.commits.pendingFor(name, id)
	ss, err := s.lookupSession(ctx, name, id)
	if err == nil && len(pend) > 0 && (ss.State == wire.SessionRunning || ss.State == stateStarting) {
		awaitLanded(pend)
		ss, err = s.lookupSession(ctx, name, id)
	}
	if err == nil && ss.State != wire.SessionRunning && ss.State != stateStarting {
		err = errCommandExited()
	}
	return ss, err
}

// writeStdin writes data to the command's stdin; nothing is written for
// no data, but an ended session still answers command_exited.
func (s *server) writeStdin(ctx context.Context, ss registry.Session, data []byte) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *shim.Client) error {
		if len(data) == 0 {
			return nil
		}
		return c.WriteStdin(ctx, data)
	})
}

// closeStdin closes the command's stdin (a real EOF, once).
func (s *server) closeStdin(ctx context.Context, ss registry.Session) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *shim.Client) error { return c.CloseStdin(ctx) })
}

// resize sets the terminal size of a tty session; invalid for a session
// without one.
func (s *server) resize(ctx context.Context, ss registry.Session, rows, cols uint16) error {
	if !ss.Request.TTY {
		return errInvalid("resize applies to tty sessions only")
	}
	return s.controlShim(ctx, ss, func(ctx context.Context, c *shim.Client) error { return c.Resize(ctx, rows, cols) })
}

// signal sends sig to the session's command.
func (s *server) signal(ctx context.Context, ss registry.Session, sig unix.Signal) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *shim.Client) error { return c.Signal(ctx, sig) })
}

// controlShim runs fn against the shim of ss, which the caller looked up
// (one registry read per request). A session that ended (or whose shim
// answers that it did) is command_exited.
func (s *server) controlShim(ctx context.Context, ss registry.Session, fn func(ctx context.Context, c *shim.Client) error) error {
	ss, err := s.refresh(ss)
	if err != nil {
		return err
	}
	if ss.State != wire.SessionRunning && ss.State != stateStarting {
		return errCommandExited()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := shim.Dial(ctx, s.sessionDir(ss))
	if err == nil {
		err = fn(ctx, c)
		c.Close()
	}
	if err != nil && !errors.Is(err, shim.ErrExited) {
		// The shim may have gone between the status and the call.
		if again, rerr := s.refresh(ss); rerr == nil && again.State != wire.SessionRunning {
			err = shim.ErrExited
		}
	}
	return err
}
