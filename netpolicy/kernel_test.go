package netpolicy

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
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The kernel tests build this world, all inside namespaces they create:
//
//	sandbox netns ──veth (pool /30)── "host" netns ──up0/wan0 10.99.0.0/24── "net" netns
//	 (Manager.Setup)                   Manager, rules,   10.99.0.1 / .2 (A) .3 (B)
//	                                   resolver, NAT     .4 (C); HTTP :80 on A and B,
//	                                                     fake DNS :53 on B and C (the upstream)
//
// The real host's namespaces are never modified; no packet leaves the
// namespaces the test made.
var (
	hostUplink = netip.MustParseAddr("10.99.0.1")
	ipA        = netip.MustParseAddr("10.99.0.2")
	ipB        = netip.MustParseAddr("10.99.0.3")
	ipC        = netip.MustParseAddr("10.99.0.4") // the upstream DNS server
	testPool   = netip.MustParsePrefix("10.98.0.0/24")
)

type lab struct {
	host     netns.NsHandle
	hostPath string
	net      netns.NsHandle
	cfg      Config
}

// requireKernel skips, loudly, only when the test cannot run here at all.
func requireKernel(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING kernel test: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to create network namespaces and nftables rules; CI runs it as root")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		t.Skipf("SKIPPING kernel test: kernel has no network namespaces: %v", err)
	}
}

// newNS creates a network namespace, held open by the returned handle
// until the test ends (then the kernel destroys it with its links).
func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
	var ns netns.NsHandle
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ns, err = netns.New()
		if err != nil {
			netns.Set(orig)
			errc <- err
			return
		}
		if err := netns.Set(orig); err != nil {
			errc <- err // thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Skipf("SKIPPING kernel test: cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func newLab(t *testing.T) *lab {
	t.Helper()
	requireKernel(t)
	l := &lab{host: newNS(t), net: newNS(t)}
	l.hostPath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(l.host))

	hh, err := netlink.NewHandleAt(l.host)
	if err != nil {
		t.Fatalf("netlink in host ns: %v", err)
	}
	defer hh.Close()
	nh, err := netlink.NewHandleAt(l.net)
	if err != nil {
		t.Fatalf("netlink in net ns: %v", err)
	}
	defer nh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "wan0", PeerNamespace: netlink.NsFd(int(l.net))}
	if err := hh.LinkAdd(veth); err != nil {
		t.Fatalf("add uplink veth: %v", err)
	}
	mustAddr := func(h *netlink.Handle, name string, addrs ...netip.Addr) {
		t.Helper()
		link, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("find %s: %v", name, err)
		}
		for _, a := range addrs {
			if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipNet(a, 24)}); err != nil {
				t.Fatalf("address %s: %v", name, err)
			}
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatalf("up %s: %v", name, err)
		}
	}
	mustAddr(hh, "lo")
	mustAddr(nh, "lo")
	mustAddr(hh, "up0", hostUplink)
	mustAddr(nh, "wan0", ipA, ipB, ipC)

	// Services in the "net" namespace.
	for _, ip := range []netip.Addr{ipA, ipB} {
		var ln net.Listener
		if err := inNetNS(l.net, func() error {
			var err error
			ln, err = net.Listen("tcp4", netip.AddrPortFrom(ip, 80).String())
			return err
		}); err != nil {
			t.Fatalf("listen in net ns: %v", err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from %s", ip)
		})}
		done := make(chan struct{})
		go func() { defer close(done); srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close(); <-done })
	}
	for _, ip := range []netip.Addr{ipB, ipC} {
		var pc net.PacketConn
		if err := inNetNS(l.net, func() error {
			var err error
			pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(ip, 53).String())
			return err
		}); err != nil {
			t.Fatalf("listen in net ns: %v", err)
		}
		started, done := make(chan struct{}), make(chan struct{})
		ds := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(fakeUpstream), NotifyStartedFunc: func() { close(started) }}
		go func() { defer close(done); ds.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { ds.Shutdown(); <-done })
	}

	state := t.TempDir()
	t.Cleanup(func() { unmountAll(t, state) })
	l.cfg = Config{
		StateDir:  state,
		Pool:      testPool,
		Upstream:  []netip.AddrPort{netip.AddrPortFrom(ipC, 53)},
		HostNetNS: l.hostPath,
	}
	// The topology itself works: the host namespace reaches A.
	if err := inNetNS(l.host, func() error { _, err := httpGet(ipA); return err }); err != nil {
		t.Fatalf("lab broken: host cannot reach A: %v", err)
	}
	return l
}

// unmountAll unmounts leftover netns bind mounts so TempDir can be removed
// even when a test failed before Teardown.
func unmountAll(t *testing.T, state string) {
	ents, _ := os.ReadDir(filepath.Join(state, "netns"))
	for _, e := range ents {
		_ = unix.Unmount(filepath.Join(state, "netns", e.Name()), unix.MNT_DETACH)
	}
}

// fakeUpstream is the "internet's" DNS: allowed.test is A, other.test is B.
func fakeUpstream(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	q := req.Question[0]
	answers := map[string]netip.Addr{"allowed.test.": ipA, "other.test.": ipB, "sub.wild.test.": ipA}
	a, ok := answers[strings.ToLower(q.Name)]
	switch {
	case !ok:
		resp.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeA:
		resp.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: a.AsSlice()}}
	}
	w.WriteMsg(resp)
}

func newManager(t *testing.T, l *lab) *Manager {
	t.Helper()
	m, err := New(context.Background(), l.cfg)
	if errors.Is(err, ErrUnsupported) {
		if _, serr := os.Stat("/sys/module/nf_tables"); serr != nil {
			t.Skipf("SKIPPING kernel test: kernel lacks nf_tables: %v", err)
		}
	}
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func setup(t *testing.T, m *Manager, id string) *Sandbox {
	t.Helper()
	sb, err := m.Setup(context.Background(), id)
	if err != nil {
		t.Fatalf("Setup(%s): %v", id, err)
	}
	t.Cleanup(func() {
		if err := m.Teardown(context.Background(), id); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("cleanup Teardown(%s): %v", id, err)
		}
	})
	return sb
}

// inSandbox runs fn with its thread inside the sandbox namespace.
func inSandbox(t *testing.T, sb *Sandbox, fn func() error) error {
	t.Helper()
	ns, err := netns.GetFromPath(sb.NetNSPath)
	if err != nil {
		t.Fatalf("open sandbox netns: %v", err)
	}
	defer ns.Close()
	return inNetNS(ns, fn)
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
func sbGet(t *testing.T, sb *Sandbox, ip netip.Addr) (string, error) {
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
func sbQuery(t *testing.T, sb *Sandbox, server netip.Addr, name string, qtype uint16) (*dns.Msg, error) {
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
func resolveA(t *testing.T, sb *Sandbox, name string) ([]netip.Addr, int, error) {
	t.Helper()
	r, err := sbQuery(t, sb, sb.Gateway, name, dns.TypeA)
	if err != nil {
		return nil, 0, err
	}
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		}
	}
	return out, r.Rcode, nil
}

func wantConnect(t *testing.T, sb *Sandbox, ip netip.Addr) {
	t.Helper()
	body, err := sbGet(t, sb, ip)
	if err != nil {
		t.Fatalf("connect to %s from sandbox: got %v, want success", ip, err)
	}
	if want := "hello from " + ip.String(); body != want {
		t.Fatalf("body from %s: got %q, want %q", ip, body, want)
	}
}

func wantNoConnect(t *testing.T, sb *Sandbox, ip netip.Addr) {
	t.Helper()
	if body, err := sbGet(t, sb, ip); err == nil {
		t.Fatalf("connect to %s from sandbox: got success (%q), want failure", ip, body)
	}
}

// wantNoDNS checks that a DNS server other than the gateway is unreachable.
func wantNoDNS(t *testing.T, sb *Sandbox, server netip.Addr) {
	t.Helper()
	if r, err := sbQuery(t, sb, server, "allowed.test", dns.TypeA); err == nil {
		t.Fatalf("DNS to %s from sandbox: got an answer (rcode %s), want failure", server, dns.RcodeToString[r.Rcode])
	}
}

func wantRefused(t *testing.T, sb *Sandbox, name string) {
	t.Helper()
	addrs, rcode, err := resolveA(t, sb, name)
	if err != nil {
		t.Fatalf("resolve %s via gateway: %v", name, err)
	}
	if rcode != dns.RcodeRefused || len(addrs) != 0 {
		t.Fatalf("resolve %s via gateway: got rcode %s addrs %v, want REFUSED and none", name, dns.RcodeToString[rcode], addrs)
	}
}

func wantResolves(t *testing.T, sb *Sandbox, name string, want netip.Addr) {
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
	if err := inNetNS(l.host, func() error {
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
	if err := inNetNS(l.host, func() error { _, err := httpGet(hostUplink); return err }); err != nil {
		t.Fatalf("host service: %v", err)
	}

	for _, p := range []Policy{{}, {Allow: []string{}}} {
		if err := m.SetPolicy(context.Background(), sb.ID, p); err != nil {
			t.Fatalf("SetPolicy(%v): %v", p, err)
		}
		for _, ip := range []netip.Addr{ipA, ipB, hostUplink, sb.Gateway} {
			wantNoConnect(t, sb, ip)
		}
		wantNoDNS(t, sb, ipB)
		wantNoDNS(t, sb, ipC)
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
	if err := m.SetPolicy(context.Background(), sb.ID, Policy{Allow: []string{"allowed.test"}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	// Before the sandbox resolves the name, A is not admitted.
	wantNoConnect(t, sb, ipA)
	wantResolves(t, sb, "allowed.test", ipA)
	wantConnect(t, sb, ipA)
	// Every other destination fails: a raw IP, other DNS servers, other names.
	wantNoConnect(t, sb, ipB)
	wantNoConnect(t, sb, hostUplink)
	wantNoDNS(t, sb, ipB)
	wantNoDNS(t, sb, ipC) // the very upstream the resolver uses
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
	if err := m.SetPolicy(context.Background(), sb.ID, Policy{}); err != nil {
		t.Fatalf("SetPolicy(empty): %v", err)
	}
	wantNoConnect(t, sb, ipA)
	wantRefused(t, sb, "allowed.test")
}
