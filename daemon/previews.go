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
	// url-or-nothing: a URL only where something listens, where the
	// proxy would connect (the sandbox's address in its namespace, or
	// loopback on the host's network).
	target, nsPath := netip.MustParseAddr("127.0.0.1"), ""
	if sb.Network != nil {
		nsb, err := s.netFor(r.Context(), sb)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if nsb == nil {
			s.writeError(w, r, errUnavailable("sandbox %s has no network namespace set up", sb.Name))
			return
		}
		target, nsPath = nsb.Addr, nsb.NetNSPath
	}
	if ok, err := listening(nsPath, target, req.Port); err != nil {
		s.writeError(w, r, errUnavailable("look for a listener in sandbox %s: %v", sb.Name, err))
		return
	} else if !ok {
		s.writeError(w, r, errConflict("nothing listens on port %d in sandbox %s", req.Port, sb.Name))
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

// listening reports whether a TCP socket listens on port where the preview
// proxy would connect: addr (the sandbox's address, or 127.0.0.1 for a
// sandbox on the host network) or a wildcard address. It reads the
// kernel's socket tables of the sandbox's network namespace
// (/proc/thread-self/net/tcp{,6} on a thread that joined it, netnsPath)
// or, with netnsPath empty, runnerd's own.
func listening(netnsPath string, addr netip.Addr, port int) (bool, error) {
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
			if listensIn(b, addr, port) {
				found = true
				return nil
			}
		}
		return nil
	}
	if netnsPath == "" {
		// Pinned to one thread only for /proc/thread-self's sake; the
		// thread is in runnerd's own namespace.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		return found, read()
	}
	err := netpolicy.RunInNetNS(netnsPath, read)
	return found, err
}

// listensIn reports whether a /proc/net/tcp{,6} table holds a LISTEN (state
// 0A) socket on port whose local address is addr, its IPv4-mapped IPv6
// form, or a wildcard.
func listensIn(table []byte, addr netip.Addr, port int) bool {
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
		if local.IsUnspecified() || local.Unmap() == addr.Unmap() {
			return true
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
