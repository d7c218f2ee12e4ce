package netpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

// parallelSandboxes is how many contained sandboxes
// TestParallelSetupPolicyTeardown makes at once (issue #36: 100).
const parallelSandboxes = 100

// TestParallelSetupPolicyTeardown sets up 100 sandboxes at once, gives
// each a policy (even ones may reach A, odd ones B) at once, checks each
// reaches exactly what its policy says, then tears them all down at once:
// nothing of them is left in the kernel or the state directory. Their
// nftables changes meet in the rule writer, which commits them in fewer
// transactions than there were changes.
func TestParallelSetupPolicyTeardown(t *testing.T) {
	l := newLab(t)
	l.cfg.Pool = scalePool
	m := newManager(t, l)
	ctx := context.Background()
	before := snapshot(t, l, m)
	commits0, ops0, _ := m.RuleStats()

	sbs := make([]*netpolicy.Sandbox, parallelSandboxes)
	parallel := func(what string, fn func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, parallelSandboxes)
		for i := range parallelSandboxes {
			wg.Go(func() { errs[i] = fn(i) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	id := func(i int) string { return fmt.Sprintf("par-%03d", i) }
	allowed := func(i int) (yes, no netip.Addr) {
		if i%2 == 0 {
			return netlab.A, netlab.B
		}
		return netlab.B, netlab.A
	}
	parallel("Setup", func(i int) (err error) {
		sbs[i], err = m.Setup(ctx, id(i))
		return err
	})
	parallel("SetPolicy", func(i int) error {
		yes, _ := allowed(i)
		return m.SetPolicy(ctx, id(i), netpolicy.Policy{Allow: []string{yes.String()}})
	})
	commits, ops, retried := m.RuleStats()
	commits, ops = commits-commits0, ops-ops0
	t.Logf("%d setups and %d policy updates: %d nftables changes in %d transactions", parallelSandboxes, parallelSandboxes, ops, commits)
	if ops < 2*parallelSandboxes {
		t.Fatalf("rule writer carried %d changes, want at least %d", ops, 2*parallelSandboxes)
	}
	if retried != 0 {
		// Nothing here fails: a batch that did failed as a whole (a
		// netlink buffer too small for its acks, say).
		t.Errorf("rule writer retried %d batches op by op", retried)
	}
	if commits >= ops {
		t.Errorf("rule writer committed %d transactions for %d changes: nothing was batched", commits, ops)
	}
	// Reachability, sandboxes probed in parallel too (a refused connect
	// is a reset, not a timeout).
	parallel("reach", func(i int) error {
		yes, no := allowed(i)
		if _, err := sbGetNoFatal(sbs[i], yes); err != nil {
			return fmt.Errorf("sandbox %s cannot reach %s its policy allows: %v", id(i), yes, err)
		}
		if _, err := sbGetNoFatal(sbs[i], no); err == nil {
			return fmt.Errorf("sandbox %s reached %s its policy does not allow", id(i), no)
		}
		return nil
	})
	parallel("Teardown", func(i int) error { return m.Teardown(ctx, id(i)) })
	if after := snapshot(t, l, m); !equalState(before, after) {
		t.Fatalf("parallel Teardown left state behind:\n got %+v\nwant %+v", after, before)
	}
	for i, sb := range sbs {
		for _, p := range []string{sb.NetNSPath, sb.ResolvConfPath, m.RecordPath(id(i))} {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Teardown left %s: %v", p, err)
			}
		}
	}
}

// sbGetNoFatal is sbGet for a goroutine other than the test's.
func sbGetNoFatal(sb *netpolicy.Sandbox, ip netip.Addr) (string, error) {
	ns, err := netns.GetFromPath(sb.NetNSPath)
	if err != nil {
		return "", fmt.Errorf("open sandbox netns: %w", err)
	}
	defer ns.Close()
	var body string
	err = netlab.InNS(ns, func() error {
		var err error
		body, err = httpGet(ip)
		return err
	})
	return body, err
}

// BenchmarkParallel100 measures, per iteration, 100 Setups at once, 100
// SetPolicys at once and 100 Teardowns at once in one Manager (the
// figures docs/benchmarks.md quotes), with the rule writer batching
// (batched) and committing one change per transaction (unbatched, as
// before the writer).
func BenchmarkParallel100(b *testing.B) {
	for _, unbatched := range []bool{false, true} {
		name := "batched"
		if unbatched {
			name = "unbatched"
		}
		b.Run(name, func(b *testing.B) {
			l := &lab{Lab: netlab.Build(b)}
			state := b.TempDir()
			b.Cleanup(func() { netlab.UnmountLeftovers(state) })
			m, err := netpolicy.New(context.Background(), netpolicy.Config{StateDir: state, Pool: scalePool,
				Upstream: []netip.AddrPort{netip.AddrPortFrom(netlab.C, 53)}, HostNetNS: l.HostNetNS})
			if err != nil {
				b.Fatalf("New: %v", err)
			}
			b.Cleanup(func() { m.Close() })
			m.SetUnbatched(unbatched)
			ctx := context.Background()
			var setup, policy, teardown time.Duration
			all := func(fn func(id string) error) time.Duration {
				t0 := time.Now()
				var wg sync.WaitGroup
				errs := make([]error, parallelSandboxes)
				for i := range parallelSandboxes {
					wg.Go(func() { errs[i] = fn(fmt.Sprintf("bp-%03d", i)) })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
				return time.Since(t0)
			}
			for b.Loop() {
				setup += all(func(id string) error { _, err := m.Setup(ctx, id); return err })
				policy += all(func(id string) error {
					return m.SetPolicy(ctx, id, netpolicy.Policy{Allow: []string{netlab.A.String(), "allowed.test"}})
				})
				teardown += all(func(id string) error { return m.Teardown(ctx, id) })
			}
			per := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
			b.ReportMetric(per(setup), "ms/100-setups")
			b.ReportMetric(per(policy), "ms/100-policies")
			b.ReportMetric(per(teardown), "ms/100-teardowns")
		})
	}
}
