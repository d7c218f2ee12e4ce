package daemon

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

func toWireSandbox(sb registry.Sandbox) wire.Sandbox {
	w := wire.Sandbox{
		Name:        sb.Name,
		Incarnation: sb.Incarnation,
		State:       sb.State,
		CreatedAt:   sb.CreatedAt,
		ParkedAt:    sb.ParkedAt,
		Workspace:   sb.Workspace,
		User:        sb.User,
		Network:     sb.Network,
		Isolated:    sb.Isolated || sb.Identity != nil,
		Limits:      sb.Limits,
	}
	if sb.Identity != nil {
		uid, gid := sb.Identity.UID, sb.Identity.GID
		w.UID, w.GID = &uid, &gid
	}
	return w
}

func (s *server) handleCreateSandbox(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateSandbox
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.createSandbox(r.Context(), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

func (s *server) handleGetSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := toWireSandbox(sb)
	// Usage only here: a few file reads per sandbox, which a listing of
	// a thousand would multiply (/metrics has it for every sandbox).
	out.Usage = s.usage(sb)
	s.writeJSON(w, http.StatusOK, out)
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
	ctx, err := withKeepCheckpoints(r) // checkpoints.go
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeNoContent(w, r, s.destroySandbox(ctx, r.PathValue("name")))
}

func (s *server) handleSuspend(w http.ResponseWriter, r *http.Request) {
	sb, err := s.suspendSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

func (s *server) handleResume(w http.ResponseWriter, r *http.Request) {
	sb, err := s.resumeSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

// eachSandbox calls fn with every sandbox of the registry, a page at a
// time, in name order. It stops at the first failed page (the error) or
// when ctx ends (ctx's error), checked before each sandbox: never a
// silently short walk.
func (s *server) eachSandbox(ctx context.Context, fn func(registry.Sandbox)) error {
	after := ""
	for {
		sbs, more, err := s.reg.ListSandboxes(after, wire.MaxListLimit)
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if err := ctx.Err(); err != nil {
				return err
			}
			fn(sb)
		}
		if !more || len(sbs) == 0 {
			return nil
		}
		after = sbs[len(sbs)-1].Name
	}
}
