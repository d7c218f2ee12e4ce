package preview

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// registry is a stateful stand-in for the daemon's token registry.
type registry struct {
	mu      sync.Mutex // guards all fields
	targets map[string]Target
	fail    error // when set, every Lookup returns it
	lookups int
}

func newRegistry() *registry { return &registry{targets: map[string]Target{}} }

func (r *registry) Lookup(ctx context.Context, token string) (Target, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookups++
	if r.fail != nil {
		return Target{}, r.fail
	}
	t, ok := r.targets[token]
	if !ok {
		return Target{}, fmt.Errorf("token %s…: %w", token[:4], ErrUnknownToken)
	}
	return t, nil
}

func (r *registry) add(t *testing.T, sandbox string, addr netip.AddrPort) string {
	t.Helper()
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.targets[tok] = Target{Sandbox: sandbox, Addr: addr}
	r.mu.Unlock()
	return tok
}

func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lookups
}

// preview is a running Server on 127.0.0.1 with the workstation template.
type preview struct {
	*Server
	port   int
	served chan error // Serve's result
	logs   *logBuffer // the Server's log output
}

func startPreview(t *testing.T, reg *registry) *preview {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	logger, logs := newTestLogger(t)
	s, err := New(Config{
		URLTemplate: fmt.Sprintf("http://{token}.localhost:%d/", port),
		Lookup:      reg.Lookup,
		Logger:      logger,
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	p := &preview{Server: s, port: port, served: make(chan error, 1), logs: logs}
	go func() { p.served <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-p.served:
			if !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return after Close")
		}
	})
	return p
}

// client is what a browser does with a *.localhost URL: it dials loopback,
// here the preview's port, whatever the name.
func (p *preview) client(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", p.port))
		},
		DisableCompression: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// startTarget stands in for a server on a port inside the sandbox.
func startTarget(t *testing.T, h http.Handler) netip.AddrPort {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return netip.MustParseAddrPort(ts.Listener.Addr().String())
}

// deadPort returns a loopback address on which nothing listens.
func deadPort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return addr
}

// deadListener returns an open loopback listener nobody will connect to.
func deadListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
