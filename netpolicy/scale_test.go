package netpolicy_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

var scaleN = flag.Int("netpolicy.scale", 1000, "contained sandboxes that exist in BenchmarkScale's large world")

// scalePool has room for 1,024 sandboxes and overlaps nothing in the lab.
var scalePool = netip.MustParsePrefix("10.100.0.0/20")

// BenchmarkScale measures, with 1 and with -netpolicy.scale contained
// sandboxes already set up in one Manager: setting up and tearing down
// one more contained sandbox, and a TCP connect round trip from a
// contained sandbox through its veth and the forward dispatch to lab
// host A. Compare the two worlds' ns/op: the dispatch is one verdict-map
// lookup and Setup/Teardown write only their sandbox's objects, so the
// ratios should stay near 1. Building the large world takes a while (it
// is logged); it is not timed.
func BenchmarkScale(b *testing.B) {
	for _, n := range []int{1, *scaleN} {
		b.Run(fmt.Sprintf("existing=%d", n), func(b *testing.B) {
			l := &lab{Lab: netlab.Build(b)}
			state := b.TempDir()
			b.Cleanup(func() { netlab.UnmountLeftovers(state) })
			l.cfg = netpolicy.Config{StateDir: state, Pool: scalePool,
				Upstream: []netip.AddrPort{netip.AddrPortFrom(netlab.C, 53)}, HostNetNS: l.HostNetNS}
			m, err := netpolicy.New(context.Background(), l.cfg)
			if err != nil {
				b.Fatalf("New: %v", err)
			}
			b.Cleanup(func() { m.Close() })
			ctx := context.Background()
			start := time.Now()
			var last *netpolicy.Sandbox
			for i := range n {
				if last, err = m.Setup(ctx, fmt.Sprintf("sb-%d", i)); err != nil {
					b.Fatalf("Setup %d: %v", i, err)
				}
				if err := m.SetPolicy(ctx, last.ID, netpolicy.Policy{Allow: []string{netlab.A.String()}}); err != nil {
					b.Fatalf("SetPolicy %d: %v", i, err)
				}
			}
			b.Logf("set up %d contained sandboxes in %v", n, time.Since(start))

			b.Run("setup-teardown", func(b *testing.B) {
				for b.Loop() {
					if _, err := m.Setup(ctx, "probe"); err != nil {
						b.Fatalf("Setup: %v", err)
					}
					if err := m.Teardown(ctx, "probe"); err != nil {
						b.Fatalf("Teardown: %v", err)
					}
				}
			})
			// The table's share alone: no link, namespace or resolver.
			b.Run("rules", func(b *testing.B) {
				for b.Loop() {
					if err := m.RulesRoundTrip("probe-rules"); err != nil {
						b.Fatalf("rules: %v", err)
					}
				}
			})
			sbNS, err := netns.GetFromPath(last.NetNSPath)
			if err != nil {
				b.Fatal(err)
			}
			defer sbNS.Close()
			b.Run("connect", func(b *testing.B) { benchConnect(b, sbNS) })
			// The control: the same connects made by the host namespace
			// itself, which no rule of the table sees. A growth here is
			// the world's (kernel, process), not the dispatch's.
			b.Run("connect-from-host", func(b *testing.B) { benchConnect(b, l.Host) })
		})
	}
}

// benchConnect measures TCP connects to lab host A:80 made from ns.
func benchConnect(b *testing.B, ns netns.NsHandle) {
	to := netip.AddrPortFrom(netlab.A, 80).String()
	// The loop runs on one thread inside ns, so only the connects are
	// measured, not the namespace switches. Each iteration makes
	// connectsPerOp connects (so a -benchtime that suits setup-teardown
	// gives enough connects), and ns/connect reports one.
	const connectsPerOp = 10
	start := time.Now()
	if err := netlab.InNS(ns, func() error {
		for b.Loop() {
			for range connectsPerOp {
				c, err := net.DialTimeout("tcp4", to, 2*time.Second)
				if err != nil {
					return err
				}
				c.(*net.TCPConn).SetLinger(0) // no TIME_WAIT pile-up
				c.Close()
			}
		}
		return nil
	}); err != nil {
		b.Fatalf("connect: %v", err)
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*connectsPerOp), "ns/connect")
}

// BenchmarkRulesScale is BenchmarkScale's rules sub-benchmark in a world
// whose existing sandboxes are nftables objects only (no links,
// namespaces or resolvers), so it builds in seconds: the table's share
// of setup and teardown at 1 and at -netpolicy.scale sandboxes.
func BenchmarkRulesScale(b *testing.B) {
	for _, n := range []int{1, *scaleN} {
		b.Run(fmt.Sprintf("existing=%d", n), func(b *testing.B) {
			l := &lab{Lab: netlab.Build(b)}
			m, err := netpolicy.New(context.Background(), netpolicy.Config{StateDir: b.TempDir(), Pool: scalePool,
				Upstream: []netip.AddrPort{netip.AddrPortFrom(netlab.C, 53)}, HostNetNS: l.HostNetNS})
			if err != nil {
				b.Fatalf("New: %v", err)
			}
			b.Cleanup(func() { m.Close() })
			for i := range n {
				if err := m.InstallRules(fmt.Sprintf("sb-%d", i), i); err != nil {
					b.Fatalf("install %d: %v", i, err)
				}
			}
			for b.Loop() {
				if err := m.RulesRoundTrip("probe-rules"); err != nil {
					b.Fatalf("rules: %v", err)
				}
			}
		})
	}
}
