package daemon

// Driving a live session through its shim: stdin (a plain write or one at
// an offset, admitted under the session's bounds before the body is read),
// closing stdin, resizing its terminal and signalling it.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

func (s *server) handleStdin(w http.ResponseWriter, r *http.Request) {
	// The session is looked up (and its incarnation checked) before the
	// body is read: a request for a session that is not there, not the
	// caller's, or ended costs no MaxStdinBody buffer.
	off := int64(-1) // no offset: a plain write
	if v := r.Header.Get(wire.HeaderStdinOffset); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			s.writeError(w, r, apierr.Invalid("%s %q: want a count of bytes", wire.HeaderStdinOffset, v))
			return
		}
		off = n
	}
	ss, err := s.stdinSession(r.Context(), r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Admitted under the session's bounds before the body is read (a
	// refused write costs no buffer), delivered in turn (stdingate.go).
	n := int64(wire.MaxStdinBody)
	if r.ContentLength >= 0 && r.ContentLength < n {
		n = r.ContentLength
	}
	wait, done, err := s.stdin.admit(ss.Key, n)
	if err != nil {
		// Read and dropped (never buffered) so the caller, still
		// sending, gets the answer rather than a broken connection.
		io.Copy(io.Discard, io.LimitReader(r.Body, wire.MaxStdinBody))
		s.writeError(w, r, err)
		return
	}
	defer done()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, n))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := wait(r.Context()); err != nil {
		s.writeError(w, r, apierr.Unavailable("stdin write abandoned: %v", err))
		return
	}
	if off < 0 {
		s.writeNoContent(w, r, s.writeStdin(r.Context(), ss, body))
		return
	}
	count, err := s.writeStdinAt(r.Context(), ss, off, body)
	if err == nil {
		w.Header().Set(wire.HeaderStdinOffset, strconv.FormatInt(count, 10))
	}
	s.writeNoContent(w, r, err)
}

func (s *server) handleCloseStdin(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err == nil {
		err = s.closeStdin(r.Context(), ss)
	}
	s.writeNoContent(w, r, err)
}

func (s *server) handleResize(w http.ResponseWriter, r *http.Request) {
	var req wire.Resize
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := validTermSize(req.Rows, req.Cols); err != nil {
		s.writeError(w, r, err)
		return
	}
	ss, err := s.session(r)
	if err == nil {
		err = s.resize(r.Context(), ss, uint16(req.Rows), uint16(req.Cols))
	}
	s.writeNoContent(w, r, err)
}

// parseSignal accepts "TERM", "SIGTERM", "15" (wire.ParseSignal).
func parseSignal(v wire.SignalName) (unix.Signal, error) {
	n, err := wire.ParseSignal(string(v))
	if err != nil {
		return 0, apierr.Invalid("%v", err)
	}
	return unix.Signal(n), nil
}

func (s *server) handleSignal(w http.ResponseWriter, r *http.Request) {
	var req wire.Signal
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ss, err := s.session(r)
	if err == nil {
		err = s.signal(r.Context(), ss, sig)
	}
	s.writeNoContent(w, r, err)
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
		err = apierr.CommandExited()
	}
	return ss, err
}

// writeStdin writes data to the command's stdin; nothing is written for
// no data, but an ended session still answers command_exited.
func (s *server) writeStdin(ctx context.Context, ss registry.Session, data []byte) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error {
		if len(data) == 0 {
			return nil
		}
		return c.WriteStdin(ctx, data)
	})
}

// writeStdinAt writes data as the stdin bytes that follow the first off
// (launch.Client.WriteStdinAt) and returns the shim's count after it. An
// empty body writes nothing and answers the count (off must not be past
// it). A gap is 409 invalid; a shim that predates offsets (started by an
// older runnerd) is not_supported.
func (s *server) writeStdinAt(ctx context.Context, ss registry.Session, off int64, data []byte) (int64, error) {
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

// closeStdin closes the command's stdin (a real EOF, once).
func (s *server) closeStdin(ctx context.Context, ss registry.Session) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error { return c.CloseStdin(ctx) })
}

// resize sets the terminal size of a tty session; invalid for a session
// without one.
func (s *server) resize(ctx context.Context, ss registry.Session, rows, cols uint16) error {
	if !ss.Request.TTY {
		return apierr.Invalid("resize applies to tty sessions only")
	}
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error { return c.Resize(ctx, rows, cols) })
}

// signal sends sig to the session's command.
func (s *server) signal(ctx context.Context, ss registry.Session, sig unix.Signal) error {
	return s.controlShim(ctx, ss, func(ctx context.Context, c *launch.Client) error { return c.Signal(ctx, sig) })
}
