package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/agentrunner/runner/daemon/preview"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// previewLookup is the preview listener's view of the registry: a token
// leads to its port on loopback only while the sandbox incarnation it was
// minted for exists and runs.
func (s *server) previewLookup(ctx context.Context, token string) (preview.Target, error) {
	p, err := s.reg.GetPreview(token)
	if errors.Is(err, registry.ErrNotFound) {
		return preview.Target{}, preview.ErrUnknownToken
	}
	if err != nil {
		return preview.Target{}, fmt.Errorf("read registry: %w", err)
	}
	sb, err := s.reg.GetSandbox(p.Sandbox)
	if errors.Is(err, registry.ErrNotFound) || (err == nil && sb.Incarnation != p.Incarnation) {
		return preview.Target{}, preview.ErrUnknownToken
	}
	if err != nil {
		return preview.Target{}, fmt.Errorf("read registry: %w", err)
	}
	return preview.Target{Sandbox: p.Sandbox, Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p.Port))}, nil
}

func (s *server) handleURLs(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r.PathValue("name"))
	if err == nil {
		err = checkIncarnation(r.Context(), sb)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.preview == nil {
		s.writeError(w, r, errNotSupported("no preview listener is configured"))
		return
	}
	var req wire.URLRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Port < 1 || req.Port > 65535 {
		s.writeError(w, r, errInvalid("port: want 1..65535"))
		return
	}
	tok, err := preview.NewToken()
	if err != nil {
		s.writeError(w, r, errUnavailable("mint token: %v", err))
		return
	}
	p, err := s.reg.PutPreview(registry.Preview{Token: tok, Sandbox: sb.Name, Incarnation: sb.Incarnation, Port: req.Port})
	if err != nil {
		s.writeError(w, r, errUnavailable("write registry: %v", err))
		return
	}
	s.writeJSON(w, http.StatusOK, wire.URL{URL: s.preview.URL(p.Token)})
}
