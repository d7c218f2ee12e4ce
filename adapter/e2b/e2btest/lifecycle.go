package e2btest

// A sandbox's life on the control plane: its time to live, pause,
// resume, connect and kill.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// removeLocked takes sb out of the control plane and returns its envd
// processes for kill; the caller holds s.mu.
func (s *Server) removeLocked(sb *sandbox) map[uint32]*proc {
	delete(s.sandboxes, sb.id)
	procs := sb.procs
	sb.procs = map[uint32]*proc{}
	if sb.state == "running" {
		close(sb.gone)
	} else {
		// Frozen processes take a SIGKILL, but let them run to it.
		standin.ContinueTagged(TagEnv, sb.id)
	}
	return procs
}

// kill ends a removed sandbox: every process in it, then its directory.
func (s *Server) kill(sb *sandbox, procs map[uint32]*proc) error {
	for _, p := range procs {
		p.abort()
		<-p.done
	}
	standin.KillTagged(TagEnv, sb.id)
	return os.RemoveAll(sb.dir)
}

// pauseLocked pauses a running sandbox; the caller holds s.mu. Its
// streams are cut and every process in it is frozen, not ended.
func (s *Server) pauseLocked(sb *sandbox) {
	sb.state = "paused"
	sb.pauses++
	close(sb.gone)
	standin.StopTagged(TagEnv, sb.id)
}

// expire enforces every sandbox's time to live until shutdown: an
// autoPause sandbox is paused, any other killed.
func (s *Server) expire() {
	defer s.wg.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		now := time.Now()
		type dead struct {
			sb    *sandbox
			procs map[uint32]*proc
		}
		var killed []dead
		s.mu.Lock()
		for _, sb := range s.sandboxes {
			if sb.state != "running" || now.Before(sb.endAt) {
				continue
			}
			if sb.autoPause {
				s.pauseLocked(sb)
				continue
			}
			killed = append(killed, dead{sb, s.removeLocked(sb)})
		}
		s.mu.Unlock()
		for _, d := range killed {
			_ = s.kill(d.sb, d.procs)
		}
	}
}

// Pauses returns how many times a sandbox was paused (by the API or by
// its time to live running out) and whether it exists.
func (s *Server) Pauses(sandboxID string) (n int, ok bool) {
	ok = s.with(sandboxID, func(sb *sandbox) { n = sb.pauses })
	return n, ok
}

// State returns a sandbox's state ("running" or "paused") and whether it
// exists.
func (s *Server) State(sandboxID string) (state string, ok bool) {
	ok = s.with(sandboxID, func(sb *sandbox) { state = sb.state })
	return state, ok
}

// with calls f with the sandbox under s.mu and reports whether it exists.
func (s *Server) with(sandboxID string, f func(*sandbox)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[sandboxID]
	if ok {
		f(sb)
	}
	return ok
}

// withPath calls f with the sandbox the request's {id} names, under
// s.mu; an id the stand-in does not hold is the API's 404.
func (s *Server) withPath(w http.ResponseWriter, r *http.Request, f func(*sandbox)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	if !ok {
		notFound(w, r.PathValue("id"))
		return
	}
	f(sb)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(sb *sandbox) {
		if sb.state == "paused" {
			apiError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already paused", sb.id))
			return
		}
		s.pauseLocked(sb)
		w.WriteHeader(http.StatusNoContent)
	})
}

// wake resumes a paused sandbox with a time to live of timeout seconds;
// the caller holds s.mu.
func (sb *sandbox) wake(timeout int32) {
	sb.state = "running"
	sb.gone = make(chan struct{})
	sb.timeout = timeout
	sb.endAt = time.Now().Add(time.Duration(timeout) * time.Second)
	standin.ContinueTagged(TagEnv, sb.id)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	req := struct {
		Timeout *int32 `json:"timeout"`
	}{}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil && err != io.EOF || req.Timeout != nil && *req.Timeout < 0 {
		apiError(w, http.StatusBadRequest, "invalid request body")
		return
	}
	timeout := int32(15)
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	s.withPath(w, r, func(sb *sandbox) {
		if sb.state == "running" {
			apiError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already running", sb.id))
			return
		}
		sb.wake(timeout)
		standin.WriteJSON(w, http.StatusCreated, sb.created())
	})
}

// setTimeout sets a running sandbox's time to live to timeout seconds
// from now (shorter or longer); a paused sandbox is 404, as the
// orchestrator that answers it holds only running ones.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	s.withTimeout(w, r, func(sb *sandbox, timeout int32) {
		if sb.state != "running" {
			notFound(w, sb.id)
			return
		}
		sb.timeout = timeout
		sb.endAt = time.Now().Add(time.Duration(timeout) * time.Second)
		w.WriteHeader(http.StatusNoContent)
	})
}

// Timeout returns the time to live last set for a sandbox, in seconds
// (at create or through the timeout call), and whether it exists.
func (s *Server) Timeout(sandboxID string) (timeout int32, ok bool) {
	ok = s.with(sandboxID, func(sb *sandbox) { timeout = sb.timeout })
	return timeout, ok
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	s.withTimeout(w, r, func(sb *sandbox, timeout int32) {
		if sb.state != "running" {
			sb.wake(timeout)
			standin.WriteJSON(w, http.StatusCreated, sb.created())
			return
		}
		// Connect only extends the time to live.
		if end := time.Now().Add(time.Duration(timeout) * time.Second); end.After(sb.endAt) {
			sb.timeout, sb.endAt = timeout, end
		}
		standin.WriteJSON(w, http.StatusOK, sb.created())
	})
}

// withTimeout reads the {"timeout": seconds} body of the timeout and
// connect calls, answering 400 when it is missing or negative, and then
// calls f as withPath does.
func (s *Server) withTimeout(w http.ResponseWriter, r *http.Request, f func(sb *sandbox, timeout int32)) {
	var req struct {
		Timeout *int32 `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Timeout == nil || *req.Timeout < 0 {
		apiError(w, http.StatusBadRequest, "timeout is required")
		return
	}
	s.withPath(w, r, func(sb *sandbox) { f(sb, *req.Timeout) })
}
