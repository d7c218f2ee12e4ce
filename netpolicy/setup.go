package netpolicy

// Setup: a sandbox's network made (or re-adopted) and its record.

import (
	"context"
	"fmt"
)

// Setup creates the sandbox's network (idempotent, get-or-create): a
// network namespace bound at NetNSPath, a veth pair with a /30 from the
// pool, a default route via the gateway, the sandbox's nftables chains and
// sets in the host namespace, and its DNS resolver. A new sandbox denies
// all egress until SetPolicy. For a sandbox that already exists (after a
// daemon restart) Setup re-adopts the kernel state and re-applies the
// persisted policy without duplicating anything. The rules are installed
// before the veth exists, so the sandbox is never reachable unfiltered.
func (m *Manager) Setup(ctx context.Context, id string) (*Sandbox, error) {
	done, err := m.enter(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	rec, err := m.recordFor(id)
	if err != nil {
		return nil, err
	}
	pp, err := parsePolicy(rec.Policy)
	if err != nil {
		pp, _ = parsePolicy(Policy{}) // a corrupt record denies all
	}
	n := m.namesFor(id)
	_, gw, addr := slotAddrs(m.cfg.Pool, rec.Slot)
	sb := &Sandbox{ID: id, NetNSPath: m.netnsPath(id), Addr: addr, Gateway: gw, ResolvConfPath: m.resolvConfPath(id)}
	if err := m.setup(ctx, n, sb, pp); err != nil {
		_ = m.denyAll(context.WithoutCancel(ctx), n) // fail closed if the sets exist
		if l := m.liveOf(id); l != nil {
			deny := &parsedPolicy{}
			l.pp = deny
			l.res.policy.Store(deny)
		}
		return nil, fmt.Errorf("set up %s: %w", id, err)
	}
	return sb, nil
}

// recordFor returns the sandbox's record, allocating a slot and
// persisting a new record (deny all) if it has none. The caller holds
// the sandbox's id lock.
func (m *Manager) recordFor(id string) (record, error) {
	m.mu.Lock()
	rec, ok := m.records[id]
	if ok {
		m.mu.Unlock()
		return rec, nil
	}
	slot, err := m.allocSlot()
	if err != nil {
		m.mu.Unlock()
		return record{}, err
	}
	rec = record{ID: id, Slot: slot, Policy: Policy{Allow: []string{}}}
	m.records[id] = rec // the slot is taken from here on
	m.mu.Unlock()
	// Persist before the kernel is touched: a crash after this point
	// re-adopts the same slot.
	if err := m.saveRecord(rec); err != nil {
		m.mu.Lock()
		delete(m.records, id)
		m.mu.Unlock()
		return record{}, fmt.Errorf("set up %s: %w", id, err)
	}
	return rec, nil
}

func (m *Manager) setup(ctx context.Context, n sbNames, sb *Sandbox, pp *parsedPolicy) error {
	m.mu.Lock()
	fwd := m.forwardOn
	m.mu.Unlock()
	if !fwd {
		// Idempotent: two Setups racing here both find it on or set it.
		if err := m.enableForwarding(); err != nil {
			return err
		}
		m.mu.Lock()
		m.forwardOn = true
		m.mu.Unlock()
	}
	if err := m.setupRules(ctx, n, sb.Addr, sb.Gateway, pp.prefixes); err != nil {
		return err
	}
	if err := m.ensureLinks(n, sb.NetNSPath, sb.Gateway, sb.Addr); err != nil {
		return err
	}
	conf := fmt.Sprintf("# written by runner netpolicy for sandbox %s\nnameserver %s\noptions edns0\n", n.id, sb.Gateway)
	if err := writeFileAtomic(sb.ResolvConfPath, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("write resolv.conf: %w", err)
	}
	if l := m.liveOf(n.id); l != nil {
		l.pp = pp
		l.res.policy.Store(pp)
		return nil
	}
	res, err := m.startResolver(n, sb.Gateway, pp)
	if err != nil {
		return err
	}
	if err := m.seedAdmitted(res); err != nil {
		res.close()
		return err
	}
	m.mu.Lock()
	m.live[n.id] = &live{pp: pp, res: res}
	m.mu.Unlock()
	return nil
}

// allocSlot returns the lowest /30 of the pool no record holds. The
// caller holds m.mu.
func (m *Manager) allocSlot() (int, error) {
	used := map[int]bool{}
	for _, r := range m.records {
		used[r.Slot] = true
	}
	for s := range poolSlots(m.cfg.Pool) {
		if !used[s] {
			return s, nil
		}
	}
	return 0, fmt.Errorf("allocate address in %s: %w", m.cfg.Pool, ErrPoolExhausted)
}
