package netpolicy

// Teardown: a sandbox's network, rules and record removed.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
)

// Teardown removes the sandbox's resolver, veth, namespace file, rules,
// sets and record. A sandbox that does not exist is success. Processes
// still inside the namespace keep it alive but have no interface left
// beyond lo; the daemon stops them first.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	done, err := m.enter(ctx, id)
	if err != nil {
		return err
	}
	defer done()
	n := m.namesFor(id)
	m.mu.Lock()
	l := m.live[id]
	delete(m.live, id)
	rec, hasRec := m.records[id]
	m.mu.Unlock()
	if l != nil {
		l.res.close()
	}
	var errs []error
	// The link goes first: with it gone nothing leaves the sandbox, so a
	// failure below can leave litter but never an open sandbox.
	if err := m.removeLinks(n, m.netnsPath(id)); err != nil {
		errs = append(errs, err)
	}
	if ok, err := m.tableExists(); err != nil {
		errs = append(errs, err)
	} else if ok {
		if err := m.removeRulesOf(ctx, n, rec, hasRec); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(m.resolvConfPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := os.Remove(m.recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		} else {
			m.mu.Lock()
			delete(m.records, id)
			m.mu.Unlock()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down %s: %w", id, err)
	}
	return nil
}

// removeRulesOf removes the kernel objects of sandbox n, its gateway
// taken from its record, or found in the kernel when there is none.
func (m *Manager) removeRulesOf(ctx context.Context, n sbNames, rec record, hasRec bool) error {
	var gws []netip.Addr
	if hasRec {
		_, gw, _ := slotAddrs(m.cfg.Pool, rec.Slot)
		gws = []netip.Addr{gw}
	} else {
		var err error
		if gws, err = m.gatewaysOf(n.hostIf); err != nil {
			return err
		}
	}
	return m.removeSandboxRules(ctx, n, gws)
}
