package preview

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/wire"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// sandboxNS is a network namespace standing in for a sandbox's: lo up, no
// other link, so nothing in it is reachable from the test's namespace.
// listen opens listeners inside it.
type sandboxNS struct {
	h    netns.NsHandle
	path string
}

func newSandboxNS(t *testing.T) *sandboxNS {
	t.Helper()
	errc := make(chan error, 1)
	var h netns.NsHandle
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if h, err = netns.New(); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("create a network namespace: %w", err)
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if rerr := netns.Set(orig); rerr != nil {
			errc <- rerr // stay locked: the thread dies
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		if h.IsOpen() {
			h.Close()
		}
		testcap.Skip(t, "netns", fmt.Sprintf("the in-namespace dial test needs a network namespace of its own (root): %v", err))
	}
	t.Cleanup(func() { h.Close() })
	return &sandboxNS{h: h, path: fmt.Sprintf("/proc/self/fd/%d", int(h))}
}

// serve starts an HTTP server inside the namespace on addr and returns
// its port.
func (s *sandboxNS) serve(t *testing.T, network, addr string, h http.Handler) uint16 {
	t.Helper()
	var l net.Listener
	err := netpolicy.RunInNetNS(s.path, func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen on %s in the namespace: %v", addr, err)
	}
	ts := httptest.NewUnstartedServer(h)
	ts.Listener.Close()
	ts.Listener = l
	ts.Start()
	t.Cleanup(ts.Close)
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// TestDialInNetNS: a Target with a network namespace is reached from
// inside it, whichever loopback address its server bound (127.0.0.1,
// ::1), byte for byte; a port nothing listens on in the namespace is
// answered at once with the not-serving 502 page, even when the test's own
// namespace serves that port on 127.0.0.1.
func TestDialInNetNS(t *testing.T) {
	ns := newSandboxNS(t)
	body := func(s string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, s) })
	}
	v4 := ns.serve(t, "tcp4", "127.0.0.1:0", body("inside on 127.0.0.1"))
	v6 := ns.serve(t, "tcp6", "[::1]:0", body("inside on ::1"))
	// The test's own namespace serves a port the namespace does not.
	outside := startTarget(t, body("outside"))
	sandboxAddr := netip.MustParseAddr("10.213.0.2") // routed nowhere: in the namespace only lo is up

	reg := newRegistry()
	add := func(port uint16) string {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		reg.mu.Lock()
		reg.targets[tok] = Target{Sandbox: "boxed", Addr: netip.AddrPortFrom(sandboxAddr, port), NetNS: ns.path}
		reg.mu.Unlock()
		return tok
	}
	p := startPreview(t, reg)
	hc := p.client(t)
	get := func(tok string) (int, string, string) {
		t.Helper()
		resp, err := hc.Get(p.URL(tok))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(wire.HeaderError), string(b)
	}
	for _, tc := range []struct {
		name string
		port uint16
		want string
	}{
		{"127.0.0.1", v4, "inside on 127.0.0.1"},
		{"::1", v6, "inside on ::1"},
	} {
		tok := add(tc.port)
		for i := range 3 { // a kept-alive connection, then more
			if status, _, got := get(tok); status != 200 || got != tc.want {
				t.Errorf("%s, request %d: %d %q, want 200 %q", tc.name, i, status, got, tc.want)
			}
		}
	}

	tok := add(outside.Port())
	start := time.Now()
	status, code, got := get(tok)
	if status != http.StatusBadGateway || code != string(wire.CodeUnavailable) || !strings.Contains(got, pageNotServing.Title) {
		t.Errorf("port served only outside the namespace: %d %s %q, body %q; want 502, unavailable, %q", status, wire.HeaderError, code, got, pageNotServing.Title)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("port nothing listens on in the namespace: answered after %v, want at once", took)
	}
}

// TestTargetAddrs: the addresses tried, in order: the sandbox's loopback,
// then its own address (not twice for a sandbox on the host's network).
func TestTargetAddrs(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"10.213.0.2:3000", "[127.0.0.1:3000 [::1]:3000 10.213.0.2:3000]"},
		{"127.0.0.1:3000", "[127.0.0.1:3000 [::1]:3000]"},
	} {
		if got := fmt.Sprint(Target{Addr: netip.MustParseAddrPort(tc.addr)}.Addrs()); got != tc.want {
			t.Errorf("Addrs of %s: %s, want %s", tc.addr, got, tc.want)
		}
	}
}
