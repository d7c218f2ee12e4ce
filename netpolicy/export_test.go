package netpolicy

import (
	"context"
	"net/netip"
	"time"
)

// Test hooks for the kernel tests, which are in package netpolicy_test
// because they build their world with netlab, and netlab imports this
// package.

// TableName is the nftables table m owns.
func (m *Manager) TableName() string { return m.cfg.Table }

// RecordPath is the file in which m keeps the record of sandbox id.
func (m *Manager) RecordPath(id string) string { return m.recordPath(id) }

// FailSetPolicy makes SetPolicy's kernel update fail with err; nil ends it.
func (m *Manager) FailSetPolicy(err error) { m.failSetPolicy = err }

// SkipCut makes SetPolicy leave conntrack alone (on) or cut revoked flows
// again (off), to show that the cut is what ends them.
func (m *Manager) SkipCut(on bool) { m.skipCut = on }

// SetAdmitTTL makes every resolver-admitted address live exactly d.
func (m *Manager) SetAdmitTTL(d time.Duration) { m.minAdmitTTL, m.maxAdmitTTL = d, d }

// RulesRoundTrip installs the nftables objects of a sandbox id (as Setup
// does, at the pool's last /30) and removes them (as Teardown does),
// without links, namespace or resolver: the table's share of a contained
// sandbox's setup and teardown.
func (m *Manager) RulesRoundTrip(id string) error {
	ctx := context.Background()
	n := m.namesFor(id)
	_, gw, addr := slotAddrs(m.cfg.Pool, poolSlots(m.cfg.Pool)-1)
	if err := m.setupRules(ctx, n, addr, gw, nil); err != nil {
		return err
	}
	return m.removeSandboxRules(ctx, n, []netip.Addr{gw})
}

// InstallRules installs the nftables objects of a sandbox id at slot
// (as Setup does), without links, namespace or resolver.
func (m *Manager) InstallRules(id string, slot int) error {
	_, gw, addr := slotAddrs(m.cfg.Pool, slot)
	return m.setupRules(context.Background(), m.namesFor(id), addr, gw, nil)
}

// RuleStats reports the rule writer's transactions, the changes they
// carried, and the batches that failed whole and were retried op by op.
func (m *Manager) RuleStats() (commits, ops, retried uint64) {
	return m.rw.commits.Load(), m.rw.ops.Load(), m.rw.retried.Load()
}

// AddRefreshes reports whether this kernel restarts an element's timeout
// on "add"; SetAddRefreshes(false) makes the admission writer refresh by
// delete-then-add, as it does on kernels before 6.10.
func (m *Manager) AddRefreshes() bool      { return m.addRefreshes }
func (m *Manager) SetAddRefreshes(on bool) { m.dynMu.Lock(); m.addRefreshes = on; m.dynMu.Unlock() }

// SetUnbatched makes the rule writer commit one change per transaction
// (on), as every change was committed before it, or batch again (off).
func (m *Manager) SetUnbatched(on bool) {
	n := int32(ruleBatchOps)
	if on {
		n = 1
	}
	m.rw.batchOps.Store(n)
}
