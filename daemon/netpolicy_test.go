package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/wire"
)

// The network-policy tests run a real runnerd (the binary, with the flags
// an operator or the conformance harness would pass) against a world made
// only of namespaces the test creates:
//
//	sandbox netns ──veth (pool /30)── "host" netns ──up0/wan0 10.99.0.0/24── "net" netns
//	 (runnerd: one per            --netpolicy-host-netns     10.99.0.1 / .2 (A) .3 (B) .4 (C)
//	  contained sandbox)           rules, resolvers, NAT      HTTP :80 on A and B,
//	                                                          fake DNS :53 on C (--dns-upstream)
//
// Commands in sandboxes are a probe program (testdata/probe) that talks
// only to those addresses. runnerd's own namespace (the real host's) is
// never changed: TestMain compares its links and nftables tables before
// and after.
var (
	worldUplink = netip.MustParseAddr("10.99.0.1")
	worldA      = netip.MustParseAddr("10.99.0.2")
	worldB      = netip.MustParseAddr("10.99.0.3")
	worldC      = netip.MustParseAddr("10.99.0.4") // the DNS upstream
	worldPool   = "10.98.0.0/24"
)

type world struct {
	host     netns.NsHandle
	hostPath string // what --netpolicy-host-netns gets
	net      netns.NsHandle
}

// requireNetKernel skips, loudly, only when this machine cannot run the
// test at all.
func requireNetKernel(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPING network policy test: needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) for network namespaces and nftables; CI runs it as root")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		t.Skipf("SKIPPING network policy test: kernel has no network namespaces: %v", err)
	}
}

// inNS runs fn on a thread that joined ns and waits for it.
func inNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- err // stay locked: the thread dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// newTestNS creates a network namespace held by the returned handle until
// the test ends; the kernel then destroys it with its links.
func newTestNS(t *testing.T) netns.NsHandle {
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
			errc <- err
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Skipf("SKIPPING network policy test: cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func newWorld(t *testing.T) *world {
	t.Helper()
	requireNetKernel(t)
	w := &world{host: newTestNS(t), net: newTestNS(t)}
	w.hostPath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(w.host))
	hh, err := netlink.NewHandleAt(w.host)
	if err != nil {
		t.Fatalf("netlink in host ns: %v", err)
	}
	defer hh.Close()
	nh, err := netlink.NewHandleAt(w.net)
	if err != nil {
		t.Fatalf("netlink in net ns: %v", err)
	}
	defer nh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "wan0", PeerNamespace: netlink.NsFd(int(w.net))}
	if err := hh.LinkAdd(veth); err != nil {
		t.Fatalf("add uplink veth: %v", err)
	}
	up := func(h *netlink.Handle, name string, addrs ...netip.Addr) {
		t.Helper()
		link, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("find %s: %v", name, err)
		}
		for _, a := range addrs {
			if err := h.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
				t.Fatalf("address %s: %v", name, err)
			}
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatalf("up %s: %v", name, err)
		}
	}
	up(hh, "lo")
	up(nh, "lo")
	up(hh, "up0", worldUplink)
	up(nh, "wan0", worldA, worldB, worldC)

	for _, ip := range []netip.Addr{worldA, worldB} {
		var ln net.Listener
		if err := inNS(w.net, func() error {
			var err error
			ln, err = net.Listen("tcp4", netip.AddrPortFrom(ip, 80).String())
			return err
		}); err != nil {
			t.Fatalf("listen in net ns: %v", err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(rw, "hello from %s", ip)
		})}
		done := make(chan struct{})
		go func() { defer close(done); srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close(); <-done })
	}
	var pc net.PacketConn
	if err := inNS(w.net, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(worldC, 53).String())
		return err
	}); err != nil {
		t.Fatalf("listen in net ns: %v", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); fakeDNS(pc) }()
	t.Cleanup(func() { pc.Close(); <-done })
	// The kernel can enforce (nf_tables, NAT): asked in the world's host
	// namespace, so the real host is untouched.
	m, err := netpolicy.New(context.Background(), netpolicy.Config{StateDir: t.TempDir(), HostNetNS: w.hostPath,
		Upstream: []netip.AddrPort{netip.AddrPortFrom(worldC, 53)}})
	if errors.Is(err, netpolicy.ErrUnsupported) {
		t.Skipf("SKIPPING network policy test: this kernel cannot enforce policies: %v", err)
	}
	if err != nil {
		t.Fatalf("netpolicy.New in the test host namespace: %v", err)
	}
	m.Close()
	return w
}

// fakeDNS is the world's DNS upstream: allowed.test is A, other.test is B,
// every other name NXDOMAIN. It ends when pc is closed.
func fakeDNS(pc net.PacketConn) {
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
		if i+1+l > len(q) {
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
	addrs := map[string]netip.Addr{"allowed.test": worldA, "other.test": worldB}
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

var (
	probeOnce sync.Once
	probeBin  string
	probeErr  error
)

// buildProbe builds testdata/probe once, next to runnerd.
func buildProbe(t *testing.T) string {
	t.Helper()
	probeOnce.Do(func() {
		probeBin = filepath.Join(filepath.Dir(runnerdBin), "probe")
		out, err := exec.Command("go", "build", "-o", probeBin, "./testdata/probe").CombinedOutput()
		if err != nil {
			probeErr = fmt.Errorf("build probe: %v\n%s", err, out)
		}
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeBin
}

// startNetRunnerd runs the runnerd binary with network containment in w.
// Cleanup destroys every sandbox, unless stop (SIGTERM, wait) was called,
// then kills the process.
func startNetRunnerd(t *testing.T, w *world, state, netState string) (a *api, stop func()) {
	t.Helper()
	sock := filepath.Join(state, "runnerd.sock")
	cmd := exec.Command(runnerdBin, "--state", state, "--listen", "none", "--socket", sock,
		"--netpolicy-state", netState, "--netpolicy-pool", worldPool,
		"--dns-upstream", worldC.String(), "--netpolicy-host-netns", w.hostPath)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+testToken)
	lw := &logWriter{t: t}
	t.Cleanup(func() { lw.mu.Lock(); lw.done = true; lw.mu.Unlock() })
	cmd.Stdout, cmd.Stderr = lw, lw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	stopped := false
	stop = func() { stopped = true; p.kill(syscall.SIGTERM) }
	t.Cleanup(func() {
		if !stopped {
			a.t = t
			a.destroyAll()
		}
		p.kill(syscall.SIGKILL)
	})
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	a = &api{t: t, base: "http://runnerd", hc: hc, token: testToken, state: state}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := hc.Get(a.base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return a, stop
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("runnerd did not come up")
		}
		select {
		case err := <-p.done:
			t.Fatalf("runnerd exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// probe runs the probe in sandbox and returns whether it succeeded and
// what it printed.
func (a *api) probe(sandbox string, args ...string) (bool, string) {
	a.t.Helper()
	// Never probe from the host network: the world's addresses are
	// routed nowhere there, and the test must send nothing outside it.
	var sb wire.Sandbox
	a.must("GET", "/v1/sandboxes/"+sandbox, nil, 200, &sb)
	if sb.Network == nil {
		a.t.Fatalf("refusing to probe from sandbox %s: it is on the host network", sandbox)
	}
	res := a.exec(sandbox, wire.Exec{Argv: append([]string{probeBin}, args...), TimeoutMS: 20000})
	out := strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
	return res.Exit.Reason == wire.ExitExited && res.Exit.Code == 0, out
}

func (a *api) wantReach(sandbox string, args ...string) {
	a.t.Helper()
	if ok, out := a.probe(sandbox, args...); !ok {
		a.t.Errorf("sandbox %s: probe %v: got failure (%s), want success", sandbox, args, out)
	}
}

func (a *api) wantNoReach(sandbox string, args ...string) {
	a.t.Helper()
	if ok, out := a.probe(sandbox, args...); ok {
		a.t.Errorf("sandbox %s: probe %v: got success (%s), want failure", sandbox, args, out)
	}
}

func (a *api) putNetwork(sandbox string, allow ...string) wire.Sandbox {
	a.t.Helper()
	var sb wire.Sandbox
	a.must("PUT", "/v1/sandboxes/"+sandbox+"/network", wire.Network{Allow: append([]string{}, allow...)}, 200, &sb)
	if sb.Network == nil || !slices.Equal(sb.Network.Allow, append([]string{}, allow...)) {
		a.t.Fatalf("PUT network %v: sandbox shows %+v", allow, sb.Network)
	}
	return sb
}

// rnLinks lists the sandbox veths (host ends) in the world's host ns.
func rnLinks(t *testing.T, w *world) []string {
	t.Helper()
	h, err := netlink.NewHandleAt(w.host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "rn") {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

func netnsFiles(t *testing.T, netState string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(netState, "netns"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestNetworkPolicy(t *testing.T) {
	w := newWorld(t)
	buildProbe(t)
	state := t.TempDir()
	netState := t.TempDir()
	// Last cleanup to run: whatever a failed test left mounted goes, so
	// TempDir can be removed.
	t.Cleanup(func() {
		for _, n := range netnsFiles(t, netState) {
			unix.Unmount(filepath.Join(netState, "netns", n), unix.MNT_DETACH)
		}
	})
	a, stop := startNetRunnerd(t, w, state, netState)

	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	if !slices.Contains(caps.Capabilities, wire.CapNetworkPolicy) {
		t.Fatalf("capabilities %v lack network_policy on a host that enforces it", caps.Capabilities)
	}
	A, B, C := worldA.String(), worldB.String(), worldC.String()
	// run runs a subtest with the api failing into it.
	t0 := t
	run := func(name string, fn func(t *testing.T)) {
		t0.Run(name, func(t *testing.T) {
			a.t = t
			defer func() { a.t = t0 }()
			fn(t)
		})
	}

	// Created with allow: [] — contained before any command runs.
	var sb wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "deny", Network: &wire.Network{Allow: []string{}}}, 200, &sb)
	if sb.Network == nil || len(sb.Network.Allow) != 0 {
		t.Fatalf("created sandbox network %+v, want allow: []", sb.Network)
	}
	sb = wire.Sandbox{}
	a.must("GET", "/v1/sandboxes/deny", nil, 200, &sb)
	if sb.Network == nil || sb.Network.Allow == nil || len(sb.Network.Allow) != 0 {
		t.Fatalf("GET sandbox network %+v, want allow: []", sb.Network)
	}
	run("allow none", func(t *testing.T) {
		a.wantNoReach("deny", "get", A)
		a.wantNoReach("deny", "get", B)
		a.wantNoReach("deny", "dns", C, "allowed.test")
		a.wantNoReach("deny", "dns", "gw", "allowed.test")
		a.wantNoReach("deny", "getname", "allowed.test")
		// The same with bash, the way the conformance probe does it.
		res := a.exec("deny", wire.Exec{Argv: []string{"timeout", "5", "bash", "-c", "exec 3<>/dev/tcp/" + A + "/80"}})
		if res.Exit.Code == 0 {
			t.Errorf("bash /dev/tcp to %s under allow: [] succeeded", A)
		}
	})
	run("allow one IP", func(t *testing.T) {
		a.putNetwork("deny", A)
		a.wantReach("deny", "get", A)
		a.wantNoReach("deny", "get", B)
		a.wantNoReach("deny", "dns", C, "allowed.test")
		res := a.exec("deny", wire.Exec{Argv: []string{"timeout", "5", "bash", "-c", "exec 3<>/dev/tcp/" + A + "/80"}})
		if res.Exit.Code != 0 {
			t.Errorf("bash /dev/tcp to the allowed %s: exit %+v, stderr %q", A, res.Exit, res.Stderr)
		}
	})
	run("allow one name", func(t *testing.T) {
		a.putNetwork("deny", "allowed.test")
		a.wantNoReach("deny", "get", B)
		a.wantNoReach("deny", "dns", C, "allowed.test")
		a.wantNoReach("deny", "dns", "gw", "other.test")
		a.wantNoReach("deny", "getname", "other.test")
		a.wantReach("deny", "getname", "allowed.test")
		a.wantReach("deny", "get", A) // admitted by the resolver's answer
	})
	run("host network then policy", func(t *testing.T) {
		var sb wire.Sandbox
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "hostnet"}, 200, &sb)
		if sb.Network != nil {
			t.Fatalf("sandbox created without a policy shows %+v", sb.Network)
		}
		ss := a.spawn("hostnet", wire.CreateSession{ID: "sleeper", Argv: []string{"sleep", "60"}})
		r := a.do("PUT", "/v1/sandboxes/hostnet/network", wire.Network{Allow: []string{A}})
		a.wantError(r, http.StatusConflict, wire.CodeInvalid)
		if d := r.errBody(t).Detail; !strings.Contains(d, "terminate or suspend") {
			t.Errorf("409 detail %q does not say to terminate or suspend the sessions", d)
		}
		sb = wire.Sandbox{}
		a.must("GET", "/v1/sandboxes/hostnet", nil, 200, &sb)
		if sb.Network != nil {
			t.Fatalf("refused PUT changed the sandbox: network %+v", sb.Network)
		}
		a.must("POST", "/v1/sandboxes/hostnet/sessions/"+ss.ID+"/terminate", wire.Terminate{GraceMS: 100}, 200, nil)
		a.putNetwork("hostnet", A)
		a.wantReach("hostnet", "get", A)
		a.wantNoReach("hostnet", "get", B)
		// A session started now runs inside: a running one no longer blocks.
		a.spawn("hostnet", wire.CreateSession{ID: "inside", Argv: []string{"sleep", "60"}})
		a.putNetwork("hostnet")
		a.wantNoReach("hostnet", "get", A)
	})
	run("create conflicts", func(t *testing.T) {
		// A create asking for containment never gets a sandbox contained
		// less or differently.
		a.wantError(a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "deny", Network: &wire.Network{Allow: []string{}}}), http.StatusConflict, wire.CodeInvalid)
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "deny", Network: &wire.Network{Allow: []string{"allowed.test"}}}, 200, &sb)
		a.wantError(a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "n2", Network: &wire.Network{Allow: []string{"::1"}}}), 400, wire.CodeInvalid)
		a.wantError(a.do("PUT", "/v1/sandboxes/deny/network", `{"allow":["a.test:80"]}`), 400, wire.CodeInvalid)
		a.wantError(a.do("PUT", "/v1/sandboxes/deny/network", `{}`), 400, wire.CodeInvalid)
	})
	run("destroy tears down", func(t *testing.T) {
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "gone", Network: &wire.Network{Allow: []string{A}}}, 200, &sb)
		links, files := rnLinks(t, w), netnsFiles(t, netState)
		a.must("DELETE", "/v1/sandboxes/gone", nil, 204, nil)
		if got := rnLinks(t, w); len(got) != len(links)-1 {
			t.Errorf("veths after destroy: got %v, want one fewer than %v", got, links)
		}
		if got := netnsFiles(t, netState); len(got) != len(files)-1 {
			t.Errorf("netns files after destroy: got %v, want one fewer than %v", got, files)
		}
		// A new incarnation of the name starts from a fresh namespace.
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "gone", Network: &wire.Network{Allow: []string{}}}, 200, &sb)
		a.wantNoReach("gone", "get", A)
		a.must("DELETE", "/v1/sandboxes/gone", nil, 204, nil)
	})
	run("restart re-adopts", func(t *testing.T) {
		links, files := rnLinks(t, w), netnsFiles(t, netState)
		stop()
		// Rules keep enforcing while no runnerd runs; a new one converges.
		a2, _ := startNetRunnerd(t0, w, state, netState) // stopped by t0's cleanups
		a2.t = t
		defer func() { a2.t = t0 }()
		var sb wire.Sandbox
		a2.must("GET", "/v1/sandboxes/deny", nil, 200, &sb)
		if sb.Network == nil || !slices.Equal(sb.Network.Allow, []string{"allowed.test"}) {
			t.Fatalf("after restart: network %+v, want allow [allowed.test]", sb.Network)
		}
		a2.wantReach("deny", "getname", "allowed.test") // the resolver is back
		a2.wantNoReach("deny", "get", B)
		a2.wantNoReach("hostnet", "get", A)
		if got := rnLinks(t, w); !slices.Equal(got, links) {
			t.Errorf("veths after restart: got %v, want %v", got, links)
		}
		if got := netnsFiles(t, netState); !slices.Equal(got, files) {
			t.Errorf("netns files after restart: got %v, want %v", got, files)
		}
		a2.destroyAll()
		if got := rnLinks(t, w); len(got) != 0 {
			t.Errorf("veths after destroying every sandbox: %v", got)
		}
		if got := netnsFiles(t, netState); len(got) != 0 {
			t.Errorf("netns files after destroying every sandbox: %v", got)
		}
	})
}

// TestNetworkPolicyOff: with --netpolicy=off (what every other test here
// uses) a root runnerd neither advertises nor accepts policies.
func TestNetworkPolicyOff(t *testing.T) {
	a := startDaemon(t)
	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	if slices.Contains(caps.Capabilities, wire.CapNetworkPolicy) {
		t.Errorf("capabilities %v advertise network_policy with containment off", caps.Capabilities)
	}
}
