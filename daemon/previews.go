package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"

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
	if sb.State == wire.SandboxSuspended {
		// Not gone (the token stays valid), but nothing of the sandbox
		// serves while it is parked: the listener answers "unavailable".
		return preview.Target{}, fmt.Errorf("sandbox %s is suspended", sb.Name)
	}
	// A contained sandbox serves inside its own network namespace: its
	// port is reached at its veth address, never at the host's loopback,
	// where some other program may listen.
	nsb, err := s.netFor(ctx, sb)
	if err != nil {
		return preview.Target{}, fmt.Errorf("reach sandbox %s: %w", sb.Name, err)
	}
	addr := netip.MustParseAddr("127.0.0.1")
	if nsb != nil {
		addr = nsb.Addr
	}
	return preview.Target{Sandbox: p.Sandbox, Addr: netip.AddrPortFrom(addr, uint16(p.Port))}, nil
}

// ownPorts are the loopback TCP ports runnerd itself serves on (the API and
// the preview listener). A preview of one of them on a host-network sandbox
// would expose runnerd through an unauthenticated URL, or loop.
func (s *server) ownPorts() map[int]bool {
	ports := map[int]bool{}
	addrs := []string{s.cfg.Listen, s.cfg.PreviewListen}
	if s.cfg.TCPListener != nil {
		addrs = append(addrs, s.cfg.TCPListener.Addr().String())
	}
	for _, a := range addrs {
		if ap, err := netip.ParseAddrPort(a); err == nil {
			ports[int(ap.Port())] = true
		} else if _, port, err := net.SplitHostPort(a); err == nil {
			if n, err := strconv.Atoi(port); err == nil {
				ports[n] = true
			}
		}
	}
	return ports
}

func (s *server) handleURLs(w http.ResponseWriter, r *http.Request) {
	sb, err := s.scopedSandbox(r.Context(), r.PathValue("name"))
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
	if sb.Network == nil && s.ownPorts()[req.Port] {
		s.writeError(w, r, errInvalid("port %d is runnerd's own listener, not the sandbox's", req.Port))
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
