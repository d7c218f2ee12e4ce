package daemon

// The sessions' HTTP surface: each handler decodes, calls one session
// operation (sessionops.go, spawn.go, stopping.go) and encodes its answer.

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// session looks up the session the request's path names (lookupSession).
func (s *server) session(r *http.Request) (registry.Session, error) {
	return s.lookupSession(r.Context(), r.PathValue("name"), r.PathValue("id"))
}

func (s *server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateSession
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	ss, created, err := s.spawn(r.Context(), r.PathValue("name"), req, spawnOptions{})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if created {
		// The command started an instant ago: answer from the record the
		// spawn already holds. Opening the journal for lengths that are
		// about zero and asking the shim for a write error it cannot have
		// yet cost a journal open and a socket round trip on every spawn
		// (docs/benchmarks.md, the step-by-step spawn); GET has them.
		s.writeJSON(w, http.StatusCreated, toWireSession(ss))
		return
	}
	s.writeJSON(w, http.StatusOK, s.wireSession(r.Context(), ss))
}

func (s *server) handleListSessions(w http.ResponseWriter, r *http.Request) {
	out, err := s.listSessions(r.Context(), r.PathValue("name"), r.URL.RawQuery)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, out)
}

func (s *server) handleGetSession(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err == nil {
		ss, err = s.refresh(ss)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, s.wireSession(r.Context(), ss))
}

// writeNoContent answers a control request: 204, or its error.
func (s *server) writeNoContent(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) handleStdin(w http.ResponseWriter, r *http.Request) {
	// The session is looked up (and its incarnation checked) before the
	// body is read: a request for a session that is not there, not the
	// caller's, or ended costs no MaxStdinBody buffer.
	off := int64(-1) // no offset: a plain write
	if v := r.Header.Get(wire.HeaderStdinOffset); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			s.writeError(w, r, errInvalid("%s %q: want a count of bytes", wire.HeaderStdinOffset, v))
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
		s.writeError(w, r, errUnavailable("stdin write abandoned: %v", err))
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
		return 0, errInvalid("%v", err)
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

func (s *server) handleTerminate(w http.ResponseWriter, r *http.Request) {
	var req wire.Terminate
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.GraceMS == 0 { // absent, 0 or an empty body: the default (protocol.md)
		req.GraceMS = 10000
	}
	if req.GraceMS < 1 || req.GraceMS > wire.MaxGraceMS {
		s.writeError(w, r, errInvalid("grace_ms: want 1..%d", wire.MaxGraceMS))
		return
	}
	ss, err := s.session(r)
	if err == nil {
		ss, err = s.terminate(r.Context(), ss, time.Duration(req.GraceMS)*time.Millisecond)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, ss.Exit)
}

func (s *server) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	ss, err := s.session(r)
	if err == nil {
		err = s.removeSession(r.Context(), ss)
	}
	var ae *apiError
	if err != nil && !(errors.As(err, &ae) && ae.code == wire.CodeNotFound) {
		// Absent is success, like a sandbox destroy: so is a sandbox, or
		// an incarnation, that is gone, and every session with it.
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
