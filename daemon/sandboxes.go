package daemon

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

func toWireSandbox(sb registry.Sandbox) wire.Sandbox {
	return wire.Sandbox{
		Name:        sb.Name,
		Incarnation: sb.Incarnation,
		State:       sb.State,
		CreatedAt:   sb.CreatedAt,
		ParkedAt:    sb.ParkedAt,
		Workspace:   sb.Workspace,
		User:        sb.User,
		Network:     sb.Network,
	}
}

func (s *server) workspace(name string) string {
	return filepath.Join(s.cfg.StateDir, "sandboxes", name)
}

func (s *server) handleCreateSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateSandbox
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := validName(req.Name); err != nil {
		s.writeError(w, r, err)
		return
	}
	var network *wire.Network
	if req.Network != nil {
		if s.net == nil {
			s.writeError(w, r, errNoNetPolicy())
			return
		}
		var err error
		if network, err = parseNetwork(*req.Network); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	var uid, gid = -1, -1
	if req.User != "" {
		u, err := user.Lookup(req.User)
		if err != nil {
			s.writeError(w, r, errInvalid("user %q: %v", req.User, err))
			return
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	unlock := s.locks.Lock(req.Name)
	defer unlock()
	ws := s.workspace(req.Name)
	// Create the directory before the record: a record always names a
	// workspace that exists. A directory left by a failed create is reused.
	// 0700 (and owned by the run-as user, below): the workspace is the
	// agent's memory and may hold its credentials; no other local user,
	// including another sandbox's run-as user, may read it.
	if err := os.MkdirAll(ws, 0o700); err != nil {
		s.writeError(w, r, errUnavailable("create workspace: %v", err))
		return
	}
	if err := os.Chmod(ws, 0o700); err != nil { // a directory left by a failed create
		s.writeError(w, r, errUnavailable("create workspace: %v", err))
		return
	}
	sb, created, err := s.reg.CreateSandbox(registry.Sandbox{
		Name:      req.Name,
		State:     wire.SandboxRunning,
		CreatedAt: time.Now().UTC(),
		Workspace: ws,
		User:      req.User,
		Network:   network,
	})
	if err != nil {
		s.writeError(w, r, errUnavailable("write registry: %v", err))
		return
	}
	if !created && sb.User != req.User {
		s.writeError(w, r, errConflict("%s: sandbox %q exists with user %q", wire.DetailConflict, sb.Name, sb.User))
		return
	}
	// A create that asks for containment never gets a sandbox contained
	// less (or differently) than asked; one that does not ask gets the
	// sandbox as it is.
	if !created && network != nil && !sameNetwork(sb.Network, network) {
		s.writeError(w, r, errConflict("%s: sandbox %q exists with a different network policy (change it with PUT /v1/sandboxes/%s/network)", wire.DetailConflict, sb.Name, sb.Name))
		return
	}
	if sb.Network != nil && (created || network != nil) {
		// Contained before create returns, so no command can run outside.
		// A failure leaves the record (denying all): a retry sets it up.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
		defer cancel()
		if _, err := s.ensureNet(ctx, sb); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if created {
		if uid >= 0 {
			if err := os.Chown(ws, uid, gid); err != nil {
				s.log.Warn("chown workspace", "sandbox", sb.Name, "err", err)
			}
		}
		s.log.Info("sandbox created", "sandbox", sb.Name, "incarnation", sb.Incarnation, "contained", sb.Network != nil)
		if sb.Network != nil {
			s.warnRootContained(sb)
		}
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

func (s *server) handleGetSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

func (s *server) handleListSandboxes(w http.ResponseWriter, r *http.Request) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		s.writeError(w, r, errInvalid("query: %v", err))
		return
	}
	limit := wire.DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > wire.MaxListLimit {
			s.writeError(w, r, errInvalid("limit %q: want 1..%d", v, wire.MaxListLimit))
			return
		}
		limit = n
	}
	var after string
	if tok := q.Get("page_token"); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || validName(string(raw)) != nil {
			s.writeError(w, r, errInvalid("malformed page_token"))
			return
		}
		after = string(raw)
	}
	sbs, more, err := s.reg.ListSandboxes(after, limit)
	if err != nil {
		s.writeError(w, r, errUnavailable("read registry: %v", err))
		return
	}
	out := wire.SandboxList{Sandboxes: make([]wire.Sandbox, 0, len(sbs))}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, toWireSandbox(sb))
	}
	if more && len(sbs) > 0 {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(sbs[len(sbs)-1].Name))
	}
	s.writeJSON(w, http.StatusOK, out)
}

func (s *server) handleDeleteSandbox(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := validName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.reg.GetSandbox(name)
	if errors.Is(err, registry.ErrNotFound) {
		// Absent is success; also sweep a workspace a failed create left.
		os.RemoveAll(s.workspace(name))
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err != nil {
		s.writeError(w, r, errUnavailable("read registry: %v", err))
		return
	}
	if checkIncarnation(r.Context(), sb) != nil {
		// The caller's incarnation is gone; the live sandbox is a newer
		// one, which this call must not touch.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	sessions, err := s.stopSandboxSessions(r.Context(), name, s.cfg.TerminateGrace)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Every process of the sandbox has ended: its namespace can go.
	if err := s.teardownNet(r.Context(), sb); err != nil {
		s.writeError(w, r, err)
		return
	}
	for _, ss := range sessions {
		if err := os.RemoveAll(s.sessionDir(ss)); err != nil {
			s.writeError(w, r, errUnavailable("remove session %s: %v", ss.ID, err))
			return
		}
	}
	if err := os.RemoveAll(s.workspace(name)); err != nil {
		s.writeError(w, r, errUnavailable("remove workspace: %v", err))
		return
	}
	if err := s.reg.DeletePreviews(name); err != nil {
		s.writeError(w, r, errUnavailable("write registry: %v", err))
		return
	}
	if err := s.reg.DeleteSandbox(name); err != nil {
		s.writeError(w, r, errUnavailable("write registry: %v", err))
		return
	}
	s.log.Info("sandbox destroyed", "sandbox", name)
	w.WriteHeader(http.StatusNoContent)
}

// stopSandboxSessions terminates every session of sandbox name (see
// stopSessions) and returns them.
func (s *server) stopSandboxSessions(ctx context.Context, name string, grace time.Duration) ([]registry.Session, error) {
	sessions, err := s.reg.ListSessions(name)
	if err != nil {
		return nil, errUnavailable("read registry: %v", err)
	}
	return sessions, s.stopSessions(ctx, sessions, grace)
}

func (s *server) handleSuspend(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.scopedSandbox(r.Context(), name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sb.State == wire.SandboxSuspended {
		s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
		return
	}
	if _, err := s.stopSandboxSessions(r.Context(), name, s.cfg.SuspendGrace); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err = s.reg.UpdateSandbox(name, func(sb *registry.Sandbox) error {
		now := time.Now().UTC()
		sb.State = wire.SandboxSuspended
		sb.ParkedAt = &now
		return nil
	})
	if err != nil {
		s.writeError(w, r, s.registryErr(err, name))
		return
	}
	s.log.Info("sandbox suspended", "sandbox", name)
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

func (s *server) handleResume(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := validName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.reg.UpdateSandbox(name, func(sb *registry.Sandbox) error {
		if err := checkIncarnation(r.Context(), *sb); err != nil {
			return err
		}
		if _, err := os.Stat(sb.Workspace); err != nil {
			return &apiError{status: http.StatusInternalServerError, code: wire.CodeRestoreFailed,
				detail: fmt.Sprintf("workspace: %v", err)}
		}
		sb.State = wire.SandboxRunning
		sb.ParkedAt = nil
		return nil
	})
	if err != nil {
		s.writeError(w, r, s.registryErr(err, name))
		return
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

// registryErr scopes a registry error about sandbox name.
func (s *server) registryErr(err error, name string) error {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, registry.ErrNotFound):
		return errNotFound("sandbox %q does not exist", name)
	}
	return errUnavailable("registry: %v", err)
}
