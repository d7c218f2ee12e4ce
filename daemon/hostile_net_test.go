package daemon_test

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// The network side of the hostile-command suite: the host is never a
// destination, whatever the allowlist holds, and a narrowed policy cuts
// the connections already open to what it removed.

// hostService listens on port in the lab's "host" namespace on every
// address, as runnerd's API (7323) or another host service would, and
// answers each connection with a line. Cleanup closes it and waits for
// its goroutine.
func hostService(t *testing.T, lab *netlab.Lab, port int) {
	t.Helper()
	var l net.Listener
	err := netlab.InNS(lab.Host, func() error {
		var err error
		l, err = net.Listen("tcp4", ":"+strconv.Itoa(port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost service\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
}

// hostAddrs lists the IPv4 addresses of the lab's "host" namespace but
// loopback (a sandbox's 127.0.0.1 is its own): the pool's gateways and
// the uplink.
func hostAddrs(t *testing.T, lab *netlab.Lab) []netip.Addr {
	t.Helper()
	h, err := netlink.NewHandleAt(lab.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && !ip.IsLoopback() {
			out = append(out, ip)
		}
	}
	return out
}

func TestHostileNetwork(t *testing.T) {
	lab := netlab.New(t)
	attack := buildAttack(t)
	a, _ := startHostile(t, lab)
	run := a.subtests(t)
	for _, port := range []int{7323, 8080} {
		hostService(t, lab, port)
	}
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "hostile", Network: &wire.Network{Allow: []string{}}}, 200, nil)
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "other", Network: &wire.Network{Allow: []string{}}}, 200, nil)
	attack = a.tool("hostile", attack)
	A := netlab.A.String() + ":80"

	run("10.0.0.0/8 does not open the host", func(t *testing.T) {
		a.putNetwork("hostile", "10.0.0.0/8")
		// The allowlist is live: A, in 10/8 and not the host, answers.
		if got := a.run("hostile", attack, "dial", A); got != "ok" {
			t.Fatalf("dial %s under allow 10.0.0.0/8: %q, want ok", A, got)
		}
		addrs := hostAddrs(t, lab)
		if len(addrs) < 3 {
			t.Fatalf("host addresses %v: want both sandboxes' gateways and the uplink", addrs)
		}
		for _, ip := range addrs {
			for _, port := range []int{7323, 8080} {
				addr := netip.AddrPortFrom(ip, uint16(port)).String()
				got := a.run("hostile", attack, "dial", addr)
				// Rejected with a TCP reset (netpolicy's host chain).
				if got != "connect:ECONNREFUSED" {
					t.Errorf("dial host %s from the sandbox under allow 10.0.0.0/8: %q, want connect:ECONNREFUSED", addr, got)
				}
			}
		}
	})

	run("narrowing cuts a kept-alive connection", func(t *testing.T) {
		a.putNetwork("hostile", netlab.A.String())
		ss := a.spawn("hostile", wire.CreateSession{ID: "hold", Argv: []string{attack, "hold", A}})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		up := a.attach(ctx, "hostile", ss.ID, "", func(f wire.Frame) bool { return strings.Contains(string(f.Payload), "ok ") })
		if !strings.Contains(string(up.streams["stdout"]), "ok ") {
			t.Fatalf("the kept-alive connection never answered: %q", up.streams["stdout"])
		}
		a.putNetwork("hostile")
		revoked := time.Now()
		// The held connection must fail at its next request; give it its
		// 1 s deadline and some.
		done, cancelDone := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancelDone()
		res := a.attach(done, "hostile", ss.ID, "", nil)
		if res.terminal == nil {
			a.must("POST", "/v1/sandboxes/hostile/sessions/"+ss.ID+"/terminate", wire.Terminate{GraceMS: 100}, 200, nil)
			t.Errorf("the kept-alive connection to a removed destination was still open 5 s after the update")
			res = a.attach(ctx, "hostile", ss.ID, "", nil)
		}
		lines := strings.Split(strings.TrimSpace(string(res.streams["stdout"])), "\n")
		late := 0
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) == 2 && f[0] == "ok" {
				ns, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				// 100 ms for an answer read before the cut to be printed.
				if at := time.Unix(0, ns); at.After(revoked.Add(100*time.Millisecond)) && late == 0 {
					t.Errorf("an answer on the held connection %v after the update returned", at.Sub(revoked))
					late++
				}
			}
		}
		last := lines[len(lines)-1]
		if !strings.HasPrefix(last, "cut ") {
			t.Errorf("the held connection's last line %q, want it cut", last)
		}
		t.Logf("held connection: %d answers, then %q", len(lines)-1, last)
	})
}
