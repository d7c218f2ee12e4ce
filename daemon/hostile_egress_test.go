package daemon_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// Where open egress ends (issue #34, finding 4): a sandbox with the open
// egress it gets by default never reaches link-local, where a cloud host's
// metadata service hands out its credentials, and reaches private ranges
// only when the operator says so (--egress-private allow).

// metadataAddr is a cloud's metadata service.
var metadataAddr = netip.MustParseAddr("169.254.169.254")

// serveMetadata serves HTTP on 169.254.169.254:80 in the lab's "net"
// namespace, answering stand-in credentials, and routes 169.254.0.0/16
// from the lab's "host" namespace to it, as a cloud host reaches its
// metadata service: a sandbox's connection there goes through the host's
// forwarding and NAT like any other and succeeds unless a rule refuses
// it. The host reaching it is checked (the control).
func serveMetadata(t *testing.T, lab *netlab.Lab) {
	t.Helper()
	nh, err := netlink.NewHandleAt(lab.Net)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	wan, err := nh.LinkByName("wan0")
	if err != nil {
		t.Fatal(err)
	}
	if err := nh.AddrAdd(wan, &netlink.Addr{IPNet: &net.IPNet{IP: metadataAddr.AsSlice(), Mask: net.CIDRMask(16, 32)}}); err != nil {
		t.Fatal(err)
	}
	hh, err := netlink.NewHandleAt(lab.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	up, err := hh.LinkByName("up0")
	if err != nil {
		t.Fatal(err)
	}
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: netip.MustParseAddr("169.254.0.0").AsSlice(), Mask: net.CIDRMask(16, 32)}}); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := netlab.InNS(lab.Net, func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(metadataAddr, 80).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"AccessKeyId":"stand-in","SecretAccessKey":"stand-in"}`)
	})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	if err := netlab.InNS(lab.Host, func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(metadataAddr, 80).String(), 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("control: the lab's host cannot reach the stand-in metadata service: %v", err)
	}
}

// TestHostileEgress: from a sandbox created with no options, a TCP
// connect to the metadata address is refused (connect:ECONNREFUSED, the
// sandbox chain's reset) under either --egress-private, and so it is
// under an explicit "0.0.0.0/0"; a policy naming link-local is refused
// with invalid. A private destination (the lab's A, 10.99.0.2) is
// refused under --egress-private deny (the default: the sandbox shows
// netpolicy.PublicEgress) until a policy names it, and reached under
// allow (the sandbox shows netpolicy.OpenEgress). Without the link-local
// rule the metadata connect answered ok.
func TestHostileEgress(t *testing.T) {
	attack := buildAttack(t)
	meta := netip.AddrPortFrom(metadataAddr, 80).String()
	A := netip.AddrPortFrom(netlab.A, 80).String()
	for _, tc := range []struct {
		private   string // --egress-private; "" the default
		wantAllow []string
		wantA     string // dial A from the default sandbox
	}{
		{"", netpolicy.PublicEgress().Allow, "connect:ECONNREFUSED"},
		{"allow", netpolicy.OpenEgress().Allow, "ok"},
	} {
		name := "private " + tc.private
		if tc.private == "" {
			name = "private default (deny)"
		}
		t.Run(name, func(t *testing.T) {
			lab := netlab.New(t)
			lab.EgressPrivate = tc.private
			if tc.private == "" {
				lab.EgressPrivate = "default" // no flag: runnerd's default
			}
			serveMetadata(t, lab)
			a, _ := startHostile(t, lab)
			sb := a.createSandbox("d")
			attack := podTool(t, sb, attack)
			if sb.Network == nil || !slices.Equal(sb.Network.Allow, tc.wantAllow) {
				t.Fatalf("default sandbox's network %+v, want allow %q", sb.Network, tc.wantAllow)
			}
			if got := a.run("d", attack, "dial", meta); got != "connect:ECONNREFUSED" {
				t.Errorf("dial the metadata service %s from a default sandbox: %q, want connect:ECONNREFUSED", meta, got)
			}
			if got := a.run("d", attack, "dial", A); got != tc.wantA {
				t.Errorf("dial private %s from a default sandbox: %q, want %s", A, got, tc.wantA)
			}
			// An explicit policy may name a private address, never a
			// link-local one; 0.0.0.0/0 still leaves link-local out.
			a.putNetwork("d", netlab.A.String())
			if got := a.run("d", attack, "dial", A); got != "ok" {
				t.Errorf("dial %s under allow [%s]: %q, want ok", A, netlab.A, got)
			}
			for _, bad := range []string{"169.254.169.254", "169.254.0.0/16", "169.254.169.254/32", "fe80::/10"} {
				r := a.do("PUT", "/v1/sandboxes/d/network", wire.Network{Allow: []string{bad}})
				a.wantError(r, http.StatusBadRequest, wire.CodeInvalid)
			}
			a.putNetwork("d", "0.0.0.0/0")
			if got := a.run("d", attack, "dial", meta); got != "connect:ECONNREFUSED" {
				t.Errorf("dial the metadata service under allow [0.0.0.0/0]: %q, want connect:ECONNREFUSED", got)
			}
			if got := a.run("d", attack, "dial", A); got != "ok" {
				t.Errorf("dial %s under allow [0.0.0.0/0]: %q, want ok", A, got)
			}
		})
	}
}

// TestEgressPrivateConfigRefused: a value of --egress-private other than
// allow or deny is a config error, never read as either.
func TestEgressPrivateConfigRefused(t *testing.T) {
	for _, bad := range []string{"yes", "Deny", "private"} {
		cfg := daemon.Config{EgressPrivate: bad}
		cfg.StateDir, cfg.Token, cfg.NetPolicy, cfg.Listen, cfg.Socket = t.TempDir(), testToken, daemon.NetPolicyOff, "127.0.0.1:0", "none"
		if err := daemon.Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "config: egress private") {
			t.Errorf("Run with EgressPrivate %q: %v, want a config error", bad, err)
		}
	}
}
