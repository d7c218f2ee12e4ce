// Package netlab builds a private network world for tests of network
// policy: netpolicy's own kernel tests, and tests that run runnerd (the
// daemon's, the client's conformance run) to prove egress containment
// without ever touching the real host's network:
//
//	sandbox netns ──veth (Pool /30)── "host" netns ──up0/wan0 10.99.0.0/24── "net" netns
//	 (made by netpolicy)               HostNetNS: rules,    10.99.0.1 / .2 (A) .3 (B) .4 (C)
//	                                   resolvers, NAT       HTTP :80 on A and B; DNS :53 on B and C
//
// Pass RunnerdArgs to runnerd: it then puts the host ends of its veths,
// its nftables table, NAT and resolvers into the lab's "host" namespace,
// lets open egress reach private ranges (the lab's outside is one; see
// Lab.EgressPrivate), forwards DNS to C (which, like B, answers allowed.test and
// sub.wild.test with A and other.test with B), and carves sandbox
// addresses from Pool. Commands inside a sandbox reach A or B only if the
// policy allows them; nothing else in the lab is routed anywhere, and no
// packet leaves the lab's namespaces.
//
// A Lab needs root and a kernel with network namespaces (and, for New,
// nf_tables); New and Build skip the test (saying why) otherwise.
// Everything it makes is removed by the test's cleanup: the namespaces die
// when their handles close, and the servers are stopped and waited for.
package netlab

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy"
)

// Addresses of the lab.
var (
	Uplink = netip.MustParseAddr("10.99.0.1") // the "host" end of the uplink
	A      = netip.MustParseAddr("10.99.0.2") // HTTP :80, answers "hello from 10.99.0.2"
	B      = netip.MustParseAddr("10.99.0.3") // HTTP :80, answers "hello from 10.99.0.3"
	C      = netip.MustParseAddr("10.99.0.4") // DNS :53 (UDP), the resolvers' upstream; B answers DNS too
	// Pool is the sandboxes' address pool (--netpolicy-pool).
	Pool = netip.MustParsePrefix("10.98.0.0/24")
)

// Lab is one private network world. Its fields are read-only.
type Lab struct {
	// HostNetNS is the path of the namespace that plays the host
	// (--netpolicy-host-netns): /proc/PID/fd/N of this test process,
	// valid for child processes while the test runs.
	HostNetNS string
	// Host and Net are handles to the "host" and "net" namespaces.
	Host, Net netns.NsHandle
	// EgressPrivate is what RunnerdArgs passes as --egress-private:
	// "allow" unless a test sets it; "default" passes no flag, so
	// runnerd's default applies. The lab's outside (A, B, C) is in
	// 10.99.0.0/24, a private range playing the internet, so a sandbox
	// with open egress reaches it only when private ranges are allowed.
	EgressPrivate string
	// DNSUpstream is what RunnerdArgs passes as --dns-upstream: C unless
	// a test sets it (to a DNS server of its own in the "net" namespace).
	DNSUpstream netip.Addr
	// Pool is what RunnerdArgs passes as --netpolicy-pool: the package's
	// Pool unless a test sets it (two runnerds in one lab need disjoint
	// pools: give each a copy of the Lab with its own).
	Pool netip.Prefix
}

// New builds a lab for t, or skips t when this machine cannot (not root,
// no network namespaces, no nf_tables). It fails t if building fails.
func New(t testing.TB) *Lab {
	t.Helper()
	l := Build(t)
	// Can this kernel enforce (nf_tables, inet NAT)? Asked in the lab's
	// host namespace, so the real host is untouched.
	m, err := netpolicy.New(context.Background(), netpolicy.Config{StateDir: t.TempDir(), HostNetNS: l.HostNetNS,
		Pool: Pool, Upstream: []netip.AddrPort{netip.AddrPortFrom(C, 53)}})
	if errors.Is(err, netpolicy.ErrUnsupported) {
		testcap.Skip(t, "nftables", fmt.Sprintf("this kernel cannot enforce network policies: %v", err))
	}
	if err != nil {
		t.Fatalf("netlab: netpolicy.New in the lab's host namespace: %v", err)
	}
	m.Close()
	return l
}

// Build is New without asking whether netpolicy can enforce here: for
// netpolicy's own tests, whose subject that is. It skips t only when this
// machine cannot build the lab at all (not root, no network namespaces).
func Build(t testing.TB) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "network namespaces and nftables need CAP_NET_ADMIN and CAP_SYS_ADMIN; CI runs it as root")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		testcap.Skip(t, "netns", fmt.Sprintf("kernel has no network namespaces: %v", err))
	}
	l := &Lab{Host: newNS(t), Net: newNS(t)}
	l.HostNetNS = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(l.Host))
	hh, err := netlink.NewHandleAt(l.Host)
	if err != nil {
		t.Fatalf("netlab: netlink in host ns: %v", err)
	}
	defer hh.Close()
	nh, err := netlink.NewHandleAt(l.Net)
	if err != nil {
		t.Fatalf("netlab: netlink in net ns: %v", err)
	}
	defer nh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "wan0", PeerNamespace: netlink.NsFd(int(l.Net))}
	if err := hh.LinkAdd(veth); err != nil {
		t.Fatalf("netlab: add uplink veth: %v", err)
	}
	up := func(h *netlink.Handle, name string, addrs ...netip.Addr) {
		t.Helper()
		link, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("netlab: find %s: %v", name, err)
		}
		for _, a := range addrs {
			if err := h.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
				t.Fatalf("netlab: address %s: %v", name, err)
			}
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatalf("netlab: up %s: %v", name, err)
		}
	}
	up(hh, "lo")
	up(nh, "lo")
	up(hh, "up0", Uplink)
	up(nh, "wan0", A, B, C)

	for _, ip := range []netip.Addr{A, B} {
		var ln net.Listener
		if err := InNS(l.Net, func() error {
			var err error
			ln, err = net.Listen("tcp4", netip.AddrPortFrom(ip, 80).String())
			return err
		}); err != nil {
			t.Fatalf("netlab: listen in net ns: %v", err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, "hello from %s", ip)
		})}
		done := make(chan struct{})
		go func() { defer close(done); srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close(); <-done })
	}
	for _, ip := range []netip.Addr{B, C} {
		var pc net.PacketConn
		if err := InNS(l.Net, func() error {
			var err error
			pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(ip, 53).String())
			return err
		}); err != nil {
			t.Fatalf("netlab: listen in net ns: %v", err)
		}
		done := make(chan struct{})
		go func() { defer close(done); serveDNS(pc) }()
		t.Cleanup(func() { pc.Close(); <-done })
	}
	// The topology itself works: the host namespace reaches A.
	if err := InNS(l.Host, func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(A, 80).String(), 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("netlab: lab broken: host cannot reach A: %v", err)
	}
	return l
}

// HostLinks lists the links in the namespace that plays the host.
func (l *Lab) HostLinks(t testing.TB) []netlink.Link {
	t.Helper()
	h, err := netlink.NewHandleAt(l.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	return links
}

// RunnerdArgs are the runnerd flags that make it enforce policies inside
// the lab, with its containment state in netState (a directory of the
// test's; unmount what is left in netState/netns at cleanup with
// UnmountLeftovers if the test may end before destroying its sandboxes).
func (l *Lab) RunnerdArgs(netState string) []string {
	private, upstream := l.EgressPrivate, l.DNSUpstream
	if private == "" {
		private = "allow"
	}
	if !upstream.IsValid() {
		upstream = C
	}
	pool := l.Pool
	if !pool.IsValid() {
		pool = Pool
	}
	args := []string{"--netpolicy", "auto", "--netpolicy-state", netState, "--netpolicy-pool", pool.String(),
		"--dns-upstream", upstream.String(), "--netpolicy-host-netns", l.HostNetNS}
	if private != "default" {
		args = append(args, "--egress-private", private)
	}
	return args
}

// UnmountLeftovers unmounts and removes every namespace file runnerd left
// in netState/netns (sandboxes a failed test did not destroy), so the
// test's temporary directory can be removed. Register it with t.Cleanup
// before starting runnerd, so it runs after runnerd is stopped.
func UnmountLeftovers(netState string) {
	dir := filepath.Join(netState, "netns")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		unix.Unmount(filepath.Join(dir, e.Name()), unix.MNT_DETACH)
		os.Remove(filepath.Join(dir, e.Name()))
	}
}

// ProbeArgv is a command that exits 0 if and only if it can open a TCP
// connection to host:80 within 5 s, using only bash and coreutils
// (bash's /dev/tcp). host should be an IP address: see docs/isolation.md
// on name resolution inside a sandbox.
func ProbeArgv(host string) []string {
	return []string{"timeout", "5", "bash", "-c", "exec 3<>/dev/tcp/" + host + "/80"}
}

// InNS runs fn on an OS thread that joined ns, and waits for it. Sockets
// fn creates belong to ns. It is netpolicy.RunInNetNS, given a handle.
func InNS(ns netns.NsHandle, fn func() error) error {
	return netpolicy.RunInNetNS(fmt.Sprintf("/proc/self/fd/%d", int(ns)), fn)
}

// newNS creates a network namespace held by the returned handle until the
// test ends; the kernel then destroys it with its links.
func newNS(t testing.TB) netns.NsHandle {
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
			errc <- err // stay locked: the thread dies
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		testcap.Skip(t, "netns", fmt.Sprintf("cannot create a network namespace: %v", err))
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// serveDNS answers allowed.test and sub.wild.test with A, other.test with
// B, every other name NXDOMAIN, until pc is closed.
func serveDNS(pc net.PacketConn) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp := dnsAnswer(buf[:n]); resp != nil {
			pc.WriteTo(resp, from)
		}
	}
}

// dnsAnswer answers a one-question query (standard library only).
func dnsAnswer(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	i := 12
	var labels []string
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if l > 63 || i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	i++ // the root label
	if i+4 > len(q) {
		return nil
	}
	qtype := uint16(q[i])<<8 | uint16(q[i+1])
	question := q[12 : i+4]
	name := strings.ToLower(strings.Join(labels, "."))
	addrs := map[string]netip.Addr{"allowed.test": A, "other.test": B, "sub.wild.test": A}
	a, ok := addrs[name]
	resp := []byte{q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0}
	switch {
	case !ok:
		resp[3] |= 3 // NXDOMAIN
	case qtype == 1:
		resp[7] = 1
	}
	resp = append(resp, question...)
	if ok && qtype == 1 {
		ip := a.As4()
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4)
		resp = append(resp, ip[:]...)
	}
	return resp
}

// HostSnapshot describes the real host's network configuration that
// runnerd's containment could change: links, nftables tables and
// ip_forward. Compare it before and after a test run (in TestMain) to
// prove the run left the real host alone. Empty when not root.
func HostSnapshot() (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	var parts []string
	links, err := netlink.LinkList()
	if err != nil {
		return "", fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		parts = append(parts, "link "+l.Attrs().Name)
	}
	c, err := nftables.New()
	if err != nil {
		return "", fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return "", fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		parts = append(parts, fmt.Sprintf("table %d %s", t.Family, t.Name))
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return "", err
	}
	parts = append(parts, "ip_forward "+strings.TrimSpace(string(fwd)))
	slices.Sort(parts)
	return strings.Join(parts, "\n"), nil
}
