package daemon

// The sessions' HTTP surface for creating, reading and ending one: each
// handler decodes, calls one session operation (sessionops.go, spawn.go,
// stopping.go) and encodes its answer. Listing is in sessionlist.go,
// stdin, resize and signals in sessioncontrol.go.

import (
	"errors"
	"net/http"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
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
		s.writeError(w, r, apierr.Invalid("grace_ms: want 1..%d", wire.MaxGraceMS))
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
	var ae *apierr.Error
	if err != nil && !(errors.As(err, &ae) && ae.Code == wire.CodeNotFound) {
		// Absent is success, like a sandbox destroy: so is a sandbox, or
		// an incarnation, that is gone, and every session with it.
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
