package netpolicy_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

// listenIn starts a TCP server on addr inside ns that greets each client
// with "hi" and closes; it is stopped and waited for at the test's end.
func listenIn(t *testing.T, inNS func(func() error) error, addr string) {
	t.Helper()
	var ln net.Listener
	if err := inNS(func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
}

// greet connects to to from inside inNS and reads the greeting.
func greet(inNS func(func() error) error, to netip.AddrPort) (string, error) {
	var c net.Conn
	if err := inNS(func() error {
		var err error
		c, err = net.DialTimeout("tcp4", to.String(), 2*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// TestHostIsNeverADestination attacks the host and the other sandboxes
// from a sandbox whose allowlist covers them: the host's API port and
// another service on its gateway, on another host address, on another
// sandbox's gateway, and a service inside another sandbox. Every CIDR
// that covers them opens none; DNS to its own gateway and an allowed lab
// host still work.
func TestHostIsNeverADestination(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "hostile")
	other := setup(t, m, "neighbour")
	inHost := func(fn func() error) error { return netlab.InNS(l.Host, fn) }
	inSb := func(s *netpolicy.Sandbox) func(func() error) error {
		return func(fn func() error) error { return inSandbox(t, s, fn) }
	}
	listenIn(t, inHost, "0.0.0.0:7323") // runnerd's API port
	listenIn(t, inHost, "0.0.0.0:8080")
	listenIn(t, inSb(other), "0.0.0.0:8080")

	targets := []netip.AddrPort{
		netip.AddrPortFrom(sb.Gateway, 7323),
		netip.AddrPortFrom(sb.Gateway, 8080),
		netip.AddrPortFrom(netlab.Uplink, 7323),
		netip.AddrPortFrom(netlab.Uplink, 8080),
		netip.AddrPortFrom(other.Gateway, 7323),
		netip.AddrPortFrom(other.Addr, 8080),
	}
	// The services are up: the host reaches each of them (the host's own
	// traffic into a sandbox is not filtered).
	for _, to := range targets {
		if got, err := greet(inHost, to); err != nil || got != "hi" {
			t.Fatalf("control: host to %s: got %q, %v; want \"hi\"", to, got, err)
		}
	}
	for _, allow := range []string{"10.0.0.0/8", "10.98.0.0/15", "0.0.0.0/0"} {
		t.Run(allow, func(t *testing.T) {
			if err := m.SetPolicy(context.Background(), sb.ID, netpolicy.Policy{Allow: []string{allow}}); err != nil {
				t.Fatalf("SetPolicy: %v", err)
			}
			// The allowlist works: a lab host it covers is reachable.
			wantConnect(t, sb, netlab.A)
			// DNS to its own gateway still works (the resolver answers,
			// and refuses the name: the policy has none).
			wantRefused(t, sb, "allowed.test")
			for _, to := range targets {
				if got, err := greet(inSb(sb), to); err == nil {
					t.Errorf("sandbox to %s with allow %s: got %q, want a refused connection", to, allow, got)
				}
			}
		})
	}
}

// echoServer is a TCP echo server on A in the lab's "net" namespace that
// records every byte it receives.
type echoServer struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex // guards got and conn
	got  []byte
	conn net.Conn
}

func startEcho(t *testing.T, l *lab, port uint16) *echoServer {
	t.Helper()
	e := &echoServer{}
	if err := netlab.InNS(l.Net, func() error {
		var err error
		e.ln, err = net.Listen("tcp4", netip.AddrPortFrom(netlab.A, port).String())
		return err
	}); err != nil {
		t.Fatalf("listen echo: %v", err)
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		e.conn = c
		e.mu.Unlock()
		buf := make([]byte, 512)
		for {
			n, err := c.Read(buf)
			e.mu.Lock()
			e.got = append(e.got, buf[:n]...)
			e.mu.Unlock()
			if err != nil {
				return
			}
			c.Write(buf[:n])
		}
	}()
	t.Cleanup(func() {
		e.ln.Close()
		e.mu.Lock()
		if e.conn != nil {
			e.conn.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *echoServer) received() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return string(e.got)
}

// push writes b to the client from the server side.
func (e *echoServer) push(b string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn != nil {
		e.conn.Write([]byte(b))
	}
}

// setLoose sets nf_conntrack_tcp_loose in the lab's host namespace.
func setLoose(t *testing.T, l *lab, v string) {
	t.Helper()
	if err := netlab.InNS(l.Host, func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_loose", []byte(v), 0o644)
	}); err != nil {
		t.Fatalf("set nf_conntrack_tcp_loose=%s: %v", v, err)
	}
}

// dialKept opens a connection from the sandbox to A:port and checks one
// echo round trip.
func dialKept(t *testing.T, sb *netpolicy.Sandbox, port uint16) net.Conn {
	t.Helper()
	var c net.Conn
	if err := inSandbox(t, sb, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(netlab.A, port).String(), 2*time.Second)
		return err
	}); err != nil {
		t.Fatalf("dial A:%d from sandbox: %v", port, err)
	}
	t.Cleanup(func() { c.Close() })
	roundTrip(t, c, "one\n")
	return c
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo of %q: got %q, %v", msg, buf, err)
	}
}

// TestRevocationCutsEstablishedFlows keeps a TCP connection from the
// sandbox to an allowed host open across a SetPolicy that removes the
// host: once SetPolicy returns, no byte passes either way. Run with
// nf_conntrack_tcp_loose on (a mid-stream segment is ct state new) and
// off (it is invalid).
func TestRevocationCutsEstablishedFlows(t *testing.T) {
	for _, loose := range []string{"1", "0"} {
		t.Run("tcp_loose="+loose, func(t *testing.T) {
			l := newLab(t)
			setLoose(t, l, loose)
			m := newManager(t, l)
			sb := setup(t, m, "revoke")
			ctx := context.Background()
			if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{netlab.A.String()}}); err != nil {
				t.Fatalf("SetPolicy: %v", err)
			}
			echo := startEcho(t, l, 7000)
			c := dialKept(t, sb, 7000)
			roundTrip(t, c, "two\n") // kept alive: still working

			if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{}}); err != nil {
				t.Fatalf("SetPolicy(empty): %v", err)
			}
			echo.push("push\n")
			c.SetDeadline(time.Now().Add(3 * time.Second))
			io.WriteString(c, "three\n") // may succeed locally; must not arrive
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			if n != 0 || err == nil {
				t.Fatalf("read after revocation: got %q, %v; want no bytes and an error", buf[:n], err)
			}
			time.Sleep(200 * time.Millisecond)
			if got := echo.received(); got != "one\ntwo\n" {
				t.Fatalf("server received %q, want only %q", got, "one\ntwo\n")
			}
		})
	}
}

// TestRevocationKeepsAllowedFlows: a policy update that keeps a
// destination does not disturb its flows.
func TestRevocationKeepsAllowedFlows(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "keep")
	ctx := context.Background()
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{netlab.A.String(), netlab.B.String()}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	startEcho(t, l, 7000)
	c := dialKept(t, sb, 7000)
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{netlab.A.String()}}); err != nil {
		t.Fatalf("SetPolicy(narrower): %v", err)
	}
	roundTrip(t, c, "two\n")
}

// TestAdmittedAddressTimeoutKeepsFlows documents what happens when a
// resolver-admitted address's set element times out: new connections to
// it are refused until the name is resolved again, and established flows
// to it are kept (the name is still allowed; see docs/isolation.md).
func TestAdmittedAddressTimeoutKeepsFlows(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	m.SetAdmitTTL(2 * time.Second)
	sb := setup(t, m, "expire")
	if err := m.SetPolicy(context.Background(), sb.ID, netpolicy.Policy{Allow: []string{"allowed.test"}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	wantResolves(t, sb, "allowed.test", netlab.A)
	startEcho(t, l, 7000)
	c := dialKept(t, sb, 7000)
	time.Sleep(3 * time.Second)
	wantNoConnect(t, sb, netlab.A) // the element is gone
	roundTrip(t, c, "two\n")       // the flow is kept
	wantResolves(t, sb, "allowed.test", netlab.A)
	wantConnect(t, sb, netlab.A)
}

// TestRevocationWithoutCutLeavesFlow is the control for the test above:
// with the conntrack cut switched off, the same kept-alive connection
// survives the same update (the established rule carries it), so the cut
// is what ends it.
func TestRevocationWithoutCutLeavesFlow(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	m.SkipCut(true)
	sb := setup(t, m, "no-cut")
	ctx := context.Background()
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{netlab.A.String()}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	startEcho(t, l, 7000)
	c := dialKept(t, sb, 7000)
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{}}); err != nil {
		t.Fatalf("SetPolicy(empty): %v", err)
	}
	roundTrip(t, c, "two\n")
	wantNoConnect(t, sb, netlab.A) // new connections are refused all the same
}
