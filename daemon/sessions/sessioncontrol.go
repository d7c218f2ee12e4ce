package sessions

// Driving a live session through its shim: stdin (a plain write or one at
// an offset, admitted under the session's bounds before the body is read),
// closing stdin, resizing its terminal and signalling it.

import (
	"context"
	"errors"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// ParseSignal accepts "TERM", "SIGTERM", "15" (wire.ParseSignal).
func ParseSignal(v wire.SignalName) (unix.Signal, error) {
	n, err := wire.ParseSignal(string(v))
	if err != nil {
		return 0, apierr.Invalid("%v", err)
	}
	return unix.Signal(n), nil
}

// StdinSession looks up session id of sandbox name for a stdin write. An
// exit recorded after the answer that reported it (deferredCommits) is
// waited for, so a client that saw the exit gets command_exited; so does
// any session that has ended.
//
// The wait covers a record that still says starting as well as running:
// an exec is answered with both its "running" commit (spawn) and its exit
// commit pending, so a stdin write right after that answer can read the
// record before either landed. Only an ended record needs no wait.
func (s *Manager) StdinSession(ctx context.Context, name, id string) (registry.Session, error) {
	pend := s.commits.pendingFor(name, id)
	ss, err := s.Lookup(ctx, name, id)
	if err == nil && len(pend) > 0 && (ss.State == wire.SessionRunning || ss.State == StateStarting) {
		awaitLanded(pend)
		ss, err = s.Lookup(ctx, name, id)
	}
	if err == nil && ss.State != wire.SessionRunning && ss.State != StateStarting {
		err = apierr.CommandExited()
	}
	return ss, err
}

// WriteStdin writes data to the command's stdin; nothing is written for
// no data, but an ended session still answers command_exited.
func (s *Manager) WriteStdin(ctx context.Context, ss registry.Session, data []byte) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error {
		if len(data) == 0 {
			return nil
		}
		return c.WriteStdin(ctx, data)
	})
}

// WriteStdinAt writes data as the stdin bytes that follow the first off
// (launch.Client.WriteStdinAt) and returns the shim's count after it. An
// empty body writes nothing and answers the count (off must not be past
// it). A gap is 409 invalid; a shim that predates offsets (started by an
// older runnerd) is not_supported.
func (s *Manager) WriteStdinAt(ctx context.Context, ss registry.Session, off int64, data []byte) (int64, error) {
	var count int64
	err := s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error {
		var err error
		count, err = c.WriteStdinAt(ctx, off, data)
		return err
	})
	switch {
	case errors.Is(err, sessiondir.ErrStdinGap):
		return 0, apierr.Conflict("%v", err)
	case errors.Is(err, sessiondir.ErrNoStdinOffsets):
		return 0, apierr.NotSupported("%s: this session's supervisor predates stdin offsets; write without one", wire.HeaderStdinOffset)
	}
	return count, err
}

// CloseStdin closes the command's stdin (a real EOF, once).
func (s *Manager) CloseStdin(ctx context.Context, ss registry.Session) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error { return c.CloseStdin(ctx) })
}

// Resize sets the terminal size of a tty session; invalid for a session
// without one.
func (s *Manager) Resize(ctx context.Context, ss registry.Session, rows, cols uint16) error {
	if !ss.Request.TTY {
		return apierr.Invalid("resize applies to tty sessions only")
	}
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error { return c.Resize(ctx, rows, cols) })
}

// Signal sends sig to the session's command.
func (s *Manager) Signal(ctx context.Context, ss registry.Session, sig unix.Signal) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error { return c.Signal(ctx, sig) })
}
