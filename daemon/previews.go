package daemon

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/preview"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/netpolicy"
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
	// A contained sandbox serves inside its own network namespace: the
	// proxy reaches its port from inside that namespace (its loopback,
	// then its address), never at the host's loopback, where some other
	// program may listen.
	nsb, err := s.sbx.NetFor(ctx, sb)
	if err != nil {
		return preview.Target{}, fmt.Errorf("reach sandbox %s: %w", sb.Name, err)
	}
	t := preview.Target{Sandbox: p.Sandbox, Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p.Port))}
	if nsb != nil {
		t.Addr, t.NetNS = netip.AddrPortFrom(nsb.Addr, uint16(p.Port)), nsb.NetNSPath
	}
	return t, nil
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
	sb, err := s.sbx.Scoped(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.preview == nil {
		s.writeError(w, r, apierr.NotSupported("no preview listener is configured"))
		return
	}
	var req wire.URLRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Port < 1 || req.Port > 65535 {
		s.writeError(w, r, apierr.Invalid("port: want 1..65535"))
		return
	}
	if sb.Network == nil && s.ownPorts()[req.Port] {
		s.writeError(w, r, apierr.Invalid("port %d is runnerd's own listener, not the sandbox's", req.Port))
		return
	}
	// url-or-nothing: the URL works whatever address the sandbox's server
	// bound (the proxy connects from inside the sandbox's namespace), and
	// once something listens. The answer says whether something listens
	// now, where the proxy would connect; the URL is handed over either
	// way, so a client can wait for the server instead of racing it.
	target := preview.Target{Sandbox: sb.Name, Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(req.Port))}
	if sb.Network != nil {
		nsb, err := s.sbx.NetFor(r.Context(), sb)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if nsb == nil {
			s.writeError(w, r, apierr.Unavailable("sandbox %s has no network namespace set up", sb.Name))
			return
		}
		target.Addr, target.NetNS = netip.AddrPortFrom(nsb.Addr, uint16(req.Port)), nsb.NetNSPath
	}
	ok := false
	if sb.State != wire.SandboxSuspended { // parked: nothing of it serves
		if ok, err = listening(target); err != nil {
			s.writeError(w, r, apierr.Unavailable("look for a listener in sandbox %s: %v", sb.Name, err))
			return
		}
	}
	tok, err := preview.NewToken()
	if err != nil {
		s.writeError(w, r, apierr.Unavailable("mint token: %v", err))
		return
	}
	p, err := s.reg.PutPreview(registry.Preview{Token: tok, Sandbox: sb.Name, Incarnation: sb.Incarnation, Port: req.Port})
	if err != nil {
		s.writeError(w, r, apierr.Unavailable("write registry: %v", err))
		return
	}
	s.writeJSON(w, http.StatusOK, wire.URL{URL: s.preview.URL(p.Token), Listening: &ok})
}

// listening reports whether a TCP socket listens where the preview proxy
// would connect to t: on one of t.Addrs or a wildcard address, on t's
// port. It reads the kernel's socket tables of t's network namespace
// (/proc/thread-self/net/tcp{,6} on a thread that joined it) or, for a
// sandbox on the host's network, runnerd's own.
func listening(t preview.Target) (bool, error) {
	var found bool
	read := func() error {
		for _, f := range []string{"tcp", "tcp6"} {
			b, err := os.ReadFile(filepath.Join("/proc/thread-self/net", f))
			if errors.Is(err, os.ErrNotExist) && f == "tcp6" {
				continue // IPv6 disabled
			}
			if err != nil {
				return fmt.Errorf("read socket table: %w", err)
			}
			if listensIn(b, t.Addrs()) {
				found = true
				return nil
			}
		}
		return nil
	}
	if t.NetNS == "" {
		// Pinned to one thread only for /proc/thread-self's sake; the
		// thread is in runnerd's own namespace.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		return found, read()
	}
	err := netpolicy.RunInNetNS(t.NetNS, read)
	return found, err
}

// listensIn reports whether a /proc/net/tcp{,6} table holds a LISTEN (state
// 0A) socket on the port of addrs (they share one) whose local address is
// one of addrs, its IPv4-mapped IPv6 form, or a wildcard.
func listensIn(table []byte, addrs []netip.AddrPort) bool {
	if len(addrs) == 0 {
		return false
	}
	port := int(addrs[0].Port())
	lines := strings.Split(string(table), "\n")
	for _, line := range lines[min(1, len(lines)):] {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		host, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		local, ok := procAddr(host)
		if !ok {
			continue
		}
		if local.IsUnspecified() {
			return true
		}
		for _, a := range addrs {
			if local.Unmap() == a.Addr().Unmap() {
				return true
			}
		}
	}
	return false
}

// procAddr decodes an address of /proc/net/tcp{,6}: the hex of the
// address's bytes in host order, one 32-bit word at a time.
func procAddr(h string) (netip.Addr, bool) {
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.Addr{}, false
	}
	for i := 0; i < len(raw); i += 4 {
		w := binary.NativeEndian.Uint32(raw[i:])
		binary.BigEndian.PutUint32(raw[i:], w)
	}
	a, ok := netip.AddrFromSlice(raw)
	return a, ok
}
