package netpolicy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

// The kernel tests run in a netlab world (see package netlab), all inside
// namespaces they create: the Manager's host namespace is the lab's
// "host", its upstream DNS is C, and A and B are the test hosts. The real
// host's namespaces are never modified; no packet leaves the namespaces
// the test made (TestMain checks).

// TestMain checks that the tests never touched the real host namespace:
// its links, its nftables tables and its forwarding switch.
func TestMain(m *testing.M) {
	before, err := netlab.HostSnapshot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "snapshot host network:", err)
		os.Exit(1)
	}
	code := m.Run()
	if after, err := netlab.HostSnapshot(); err != nil || after != before {
		fmt.Fprintf(os.Stderr, "FAIL: netpolicy tests modified the real host namespace (err %v)\nbefore:\n%s\nafter:\n%s\n", err, before, after)
		code = 1
	}
	os.Exit(code)
}

type lab struct {
	*netlab.Lab
	cfg netpolicy.Config
}

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{Lab: netlab.Build(t)}
	state := t.TempDir()
	t.Cleanup(func() { netlab.UnmountLeftovers(state) })
	l.cfg = netpolicy.Config{
		StateDir:  state,
		Pool:      netlab.Pool,
		Upstream:  []netip.AddrPort{netip.AddrPortFrom(netlab.C, 53)},
		HostNetNS: l.HostNetNS,
	}
	return l
}

func newManager(t *testing.T, l *lab) *netpolicy.Manager {
	t.Helper()
	m, err := netpolicy.New(context.Background(), l.cfg)
	if errors.Is(err, netpolicy.ErrUnsupported) {
		if _, serr := os.Stat("/sys/module/nf_tables"); serr != nil {
			testcap.Skip(t, "nftables", fmt.Sprintf("kernel lacks nf_tables: %v", err))
		}
	}
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func setup(t *testing.T, m *netpolicy.Manager, id string) *netpolicy.Sandbox {
	t.Helper()
	sb, err := m.Setup(context.Background(), id)
	if err != nil {
		t.Fatalf("Setup(%s): %v", id, err)
	}
	t.Cleanup(func() {
		if err := m.Teardown(context.Background(), id); err != nil && !errors.Is(err, netpolicy.ErrClosed) {
			t.Errorf("cleanup Teardown(%s): %v", id, err)
		}
	})
	return sb
}

// inSandbox runs fn with its thread inside the sandbox namespace.
func inSandbox(t *testing.T, sb *netpolicy.Sandbox, fn func() error) error {
	t.Helper()
	ns, err := netns.GetFromPath(sb.NetNSPath)
	if err != nil {
		t.Fatalf("open sandbox netns: %v", err)
	}
	defer ns.Close()
	return netlab.InNS(ns, fn)
}

func httpGet(ip netip.Addr) (string, error) {
	c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(ip, 80).String(), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// sbGet fetches http://ip/ from inside the sandbox.
func sbGet(t *testing.T, sb *netpolicy.Sandbox, ip netip.Addr) (string, error) {
	t.Helper()
	var body string
	err := inSandbox(t, sb, func() error {
		var err error
		body, err = httpGet(ip)
		return err
	})
	return body, err
}

// sbQuery sends one DNS query from inside the sandbox to server:53.
func sbQuery(t *testing.T, sb *netpolicy.Sandbox, server netip.Addr, name string, qtype uint16) (*dns.Msg, error) {
	t.Helper()
	var conn net.Conn
	if err := inSandbox(t, sb, func() error {
		var err error
		conn, err = net.Dial("udp4", netip.AddrPortFrom(server, 53).String())
		return err
	}); err != nil {
		return nil, err
	}
	defer conn.Close()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: time.Second}
	r, _, err := c.ExchangeWithConn(m, &dns.Conn{Conn: conn})
	return r, err
}

// resolveA resolves name through the sandbox's gateway resolver.
func resolveA(t *testing.T, sb *netpolicy.Sandbox, name string) ([]netip.Addr, int, error) {
	t.Helper()
	r, err := sbQuery(t, sb, sb.Gateway, name, dns.TypeA)
	if err != nil {
		return nil, 0, err
	}
	return answerA(r), r.Rcode, nil
}

func wantConnect(t *testing.T, sb *netpolicy.Sandbox, ip netip.Addr) {
	t.Helper()
	body, err := sbGet(t, sb, ip)
	if err != nil {
		t.Fatalf("connect to %s from sandbox: got %v, want success", ip, err)
	}
	if want := "hello from " + ip.String(); body != want {
		t.Fatalf("body from %s: got %q, want %q", ip, body, want)
	}
}

func wantNoConnect(t *testing.T, sb *netpolicy.Sandbox, ip netip.Addr) {
	t.Helper()
	if body, err := sbGet(t, sb, ip); err == nil {
		t.Fatalf("connect to %s from sandbox: got success (%q), want failure", ip, body)
	}
}

// wantNoDNS checks that a DNS server other than the gateway is unreachable.
func wantNoDNS(t *testing.T, sb *netpolicy.Sandbox, server netip.Addr) {
	t.Helper()
	if r, err := sbQuery(t, sb, server, "allowed.test", dns.TypeA); err == nil {
		t.Fatalf("DNS to %s from sandbox: got an answer (rcode %s), want failure", server, dns.RcodeToString[r.Rcode])
	}
}

func wantRefused(t *testing.T, sb *netpolicy.Sandbox, name string) {
	t.Helper()
	addrs, rcode, err := resolveA(t, sb, name)
	if err != nil {
		t.Fatalf("resolve %s via gateway: %v", name, err)
	}
	if rcode != dns.RcodeRefused || len(addrs) != 0 {
		t.Fatalf("resolve %s via gateway: got rcode %s addrs %v, want REFUSED and none", name, dns.RcodeToString[rcode], addrs)
	}
}

func wantResolves(t *testing.T, sb *netpolicy.Sandbox, name string, want netip.Addr) {
	t.Helper()
	addrs, rcode, err := resolveA(t, sb, name)
	if err != nil {
		t.Fatalf("resolve %s via gateway: %v", name, err)
	}
	if rcode != dns.RcodeSuccess || !slices.Equal(addrs, []netip.Addr{want}) {
		t.Fatalf("resolve %s via gateway: got rcode %s addrs %v, want NOERROR %v", name, dns.RcodeToString[rcode], addrs, want)
	}
}

func TestEmptyAllowlistDeniesEverything(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "deny-all")

	// A service on the host itself (not only the gateway) must be shut too.
	var hostLn net.Listener
	if err := netlab.InNS(l.Host, func() error {
		var err error
		hostLn, err = net.Listen("tcp4", "0.0.0.0:80")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from host")
	})}
	done := make(chan struct{})
	go func() { defer close(done); hostSrv.Serve(hostLn) }()
	defer func() { hostSrv.Close(); <-done }()
	// The host service works; only the sandbox is shut out of it.
	if err := netlab.InNS(l.Host, func() error { _, err := httpGet(netlab.Uplink); return err }); err != nil {
		t.Fatalf("host service: %v", err)
	}

	for _, p := range []netpolicy.Policy{{}, {Allow: []string{}}} {
		if err := m.SetPolicy(context.Background(), sb.ID, p); err != nil {
			t.Fatalf("SetPolicy(%v): %v", p, err)
		}
		for _, ip := range []netip.Addr{netlab.A, netlab.B, netlab.Uplink, sb.Gateway} {
			wantNoConnect(t, sb, ip)
		}
		wantNoDNS(t, sb, netlab.B)
		wantNoDNS(t, sb, netlab.C)
		for _, name := range []string{"allowed.test", "other.test", "nothing.test"} {
			wantRefused(t, sb, name)
		}
	}
	got, err := m.Policy(context.Background(), sb.ID)
	if err != nil || got.Allow == nil || len(got.Allow) != 0 {
		t.Fatalf("Policy: got %#v, %v; want empty allowlist", got, err)
	}
}

func TestAllowlistOfOneHost(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "one-host")
	if err := m.SetPolicy(context.Background(), sb.ID, netpolicy.Policy{Allow: []string{"allowed.test"}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	// Before the sandbox resolves the name, A is not admitted.
	wantNoConnect(t, sb, netlab.A)
	wantResolves(t, sb, "allowed.test", netlab.A)
	wantConnect(t, sb, netlab.A)
	// Every other destination fails: a raw IP, other DNS servers, other names.
	wantNoConnect(t, sb, netlab.B)
	wantNoConnect(t, sb, netlab.Uplink)
	wantNoDNS(t, sb, netlab.B)
	wantNoDNS(t, sb, netlab.C) // the very upstream the resolver uses
	wantRefused(t, sb, "other.test")
	wantRefused(t, sb, "sub.allowed.test")
	// The resolver answers over TCP too.
	var tc net.Conn
	if err := inSandbox(t, sb, func() error {
		var err error
		tc, err = net.Dial("tcp4", netip.AddrPortFrom(sb.Gateway, 53).String())
		return err
	}); err != nil {
		t.Fatalf("dial resolver over TCP: %v", err)
	}
	q := new(dns.Msg)
	q.SetQuestion("allowed.test.", dns.TypeA)
	r, _, err := (&dns.Client{Net: "tcp", Timeout: time.Second}).ExchangeWithConn(q, &dns.Conn{Conn: tc})
	tc.Close()
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("allowed.test over TCP: got %v, %v; want one A", r, err)
	}
	// AAAA of an allowed name: empty NOERROR (sandboxes are IPv4-only).
	r, err = sbQuery(t, sb, sb.Gateway, "allowed.test", dns.TypeAAAA)
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Fatalf("AAAA allowed.test: got %v %v, want empty NOERROR", r, err)
	}
	// Revoking the name revokes the admitted address.
	if err := m.SetPolicy(context.Background(), sb.ID, netpolicy.Policy{}); err != nil {
		t.Fatalf("SetPolicy(empty): %v", err)
	}
	wantNoConnect(t, sb, netlab.A)
	wantRefused(t, sb, "allowed.test")
}
