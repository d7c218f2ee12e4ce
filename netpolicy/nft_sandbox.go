package netpolicy

// One sandbox's nftables objects: its chain and its static and dynamic
// sets, named from its id, and its elements in the shared dispatch maps;
// SetPolicy's and the resolver's updates of its sets; and their removal,
// whose cost never depends on how many other sandboxes exist.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Kernel object names of one sandbox. Everything is derived from the id,
// so Teardown finds the objects even when the persisted record is gone.
type sbNames struct {
	id     string
	hostIf string // host end of the veth (IFNAMSIZ: at most 15 bytes)
	out    string // chain: forwarded traffic from the sandbox
	static string // set: addresses and CIDRs from the policy (interval)
	dyn    string // set: addresses admitted by the resolver (timeouts)
}

// namesFor names the objects of sandbox id in this Manager's table; its
// veth's host end starts with the table's interface prefix.
func (m *Manager) namesFor(id string) sbNames {
	sum := sha256.Sum256([]byte(id))
	prefix := m.ifPrefix()
	return sbNames{
		id:     id,
		hostIf: prefix + hex.EncodeToString(sum[:])[:15-len(prefix)],
		out:    "out-" + id,
		static: "allow-" + id,
		dyn:    "dns-" + id,
	}
}

// Base chains and dispatch maps of the table. The base chains accept by
// default and never change the fate of traffic that is not a sandbox's.
// A sandbox's traffic is dispatched by one lookup in a verdict map keyed
// by interface name (constant per-packet cost, whatever the number of
// sandboxes) to that sandbox's chain, which ends in a reject.
const (
	chainForward     = "forward"
	chainInput       = "input"
	chainPostrouting = "postrouting"
	mapOut           = "sandbox-out" // iifname → jump out-ID (forward)
	setGateway       = "sandbox-gw"  // iifname . gateway address (input)
)

// dynamic set element lifetimes, clamped from DNS TTLs: a short TTL must
// not cut an address a client still has cached, a huge one must not
// admit an address forever.
const (
	minAdmitTTL = 5 * time.Minute
	maxAdmitTTL = 24 * time.Hour
)

// Set IDs are batch-local handles the kernel uses to resolve a reference
// to a set created in the same batch. They are given explicitly (the
// library would take them from a process-wide counter) so that a batch's
// bytes depend only on its content (see the golden tests).
const (
	idMapOut  = 1
	idGateway = 2
	idStatic  = 3
	idDyn     = 4
	// idLegacyHostMap is the ID of an earlier layout's map, deleted by New.
	idLegacyHostMap = 5
	// idProbe is the set probeAddRefresh makes and deletes in New.
	idProbe = 6
)

// gatewayElem is the sandbox-gw element of a sandbox: its veth's name
// (16 bytes, NUL-padded) followed by its gateway address.
func gatewayElem(ifName string, gw netip.Addr) nftables.SetElement {
	return nftables.SetElement{Key: append(ifname(ifName), gw.AsSlice()...)}
}

// sandboxSets describes the sandbox's two sets, with batch-local IDs from
// ids (unique within the transaction the op is part of).
func sandboxSets(t *nftables.Table, n sbNames, ids *batchIDs) (static, dyn *nftables.Set) {
	sid, did := ids.pair()
	static = &nftables.Set{Table: t, Name: n.static, ID: sid, KeyType: nftables.TypeIPAddr, Interval: true}
	// The kernel holds the cap on admitted addresses: a set made by an
	// earlier version has no size, and keeps none (re-adding a set with
	// another size changes nothing), until its sandbox is made again;
	// the admission writer caps it all the same.
	dyn = &nftables.Set{Table: t, Name: n.dyn, ID: did, KeyType: nftables.TypeIPAddr, HasTimeout: true, Size: MaxAdmitted}
	return static, dyn
}

// bigPolicy is the size of a policy (in prefixes) whose set content is
// committed in a transaction of its own rather than batched with other
// sandboxes' changes: it fills a netlink send by itself.
const bigPolicy = 1024

// setupRules creates (or rewrites) the sandbox's sets, chain and dispatch
// map elements and fills its static set with prefixes, in one atomic
// transaction (through the rule writer: with other sandboxes' changes).
// The chain is flushed and refilled in that transaction, so re-running it
// after a restart never duplicates a rule and never opens a window
// without the final reject. Its cost does not depend on how many other
// sandboxes exist: it reads nothing and writes only this sandbox's
// objects.
func (m *Manager) setupRules(ctx context.Context, n sbNames, addr, gw netip.Addr, prefixes []netip.Prefix) error {
	err := m.apply(ctx, len(prefixes) > bigPolicy, func(c *nftables.Conn, ids *batchIDs) error {
		static, dyn := sandboxSets(m.table(), n, ids)
		if err := m.addSandboxRules(c, n, addr, gw, static, dyn); err != nil {
			return err
		}
		return addStatic(c, n, static, dyn, prefixes, false)
	})
	if err != nil {
		return fmt.Errorf("install rules for %s: %w", n.id, err)
	}
	return nil
}

// addSandboxRules adds the messages that make the sandbox's sets, chain
// and dispatch elements to c.
func (m *Manager) addSandboxRules(c *nftables.Conn, n sbNames, addr, gw netip.Addr, static, dyn *nftables.Set) error {
	t := m.table()
	if err := c.AddSet(static, nil); err != nil {
		return fmt.Errorf("add set %s: %w", n.static, err)
	}
	if err := c.AddSet(dyn, nil); err != nil {
		return fmt.Errorf("add set %s: %w", n.dyn, err)
	}
	out := c.AddChain(&nftables.Chain{Name: n.out, Table: t})
	c.FlushChain(out)

	add := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(exprs...)})
	}
	// out: the sandbox's forwarded egress. The host's own addresses never
	// get here (they take the input path, see ensureTable); the pool's do:
	// another sandbox is refused before the allowlist is read, so a CIDR
	// that covers the pool opens no sandbox. An invalid packet (a TCP
	// segment whose conntrack entry was deleted, with
	// nf_conntrack_tcp_loose=0) is dropped, and established flows are
	// accepted only while conntrack holds them: a revocation deletes
	// their entries and their next packet is judged as new (see cutFlows).
	add(out, matchIPv4(), matchAddr(12, addr, expr.CmpOpNeq), verdict(expr.VerdictDrop)) // anti-spoof
	add(out, matchIPv4(), matchPrefix(16, m.cfg.Pool), rejectTCP())
	add(out, matchIPv4(), matchPrefix(16, m.cfg.Pool), rejectAny())
	// Link-local (a cloud's metadata service, 169.254.169.254) is never a
	// destination either: a CIDR that covers it ("0.0.0.0/0") or a DNS
	// answer naming it opens nothing there.
	add(out, matchIPv4(), matchPrefix(16, LinkLocal), rejectTCP())
	add(out, matchIPv4(), matchPrefix(16, LinkLocal), rejectAny())
	add(out, matchCtState(expr.CtStateBitINVALID), verdict(expr.VerdictDrop))
	add(out, matchCtEstablished(), verdict(expr.VerdictAccept))
	add(out, matchIPv4(), matchSet(16, static), verdict(expr.VerdictAccept))
	add(out, matchIPv4(), matchSet(16, dyn), verdict(expr.VerdictAccept))
	add(out, rejectTCP())
	add(out, rejectAny())

	// Dispatch last, so the element points at complete chains. Adding an
	// element that exists with the same verdict is a no-op (no
	// NLM_F_EXCL), which is what makes re-adoption converge.
	outMap, gws := m.dispatchSets(t)
	if err := c.SetAddElements(outMap, []nftables.SetElement{dispatchElem(n.hostIf, n.out)}); err != nil {
		return fmt.Errorf("add dispatch to %s: %w", n.out, err)
	}
	if err := c.SetAddElements(gws, []nftables.SetElement{gatewayElem(n.hostIf, gw)}); err != nil {
		return fmt.Errorf("add gateway of %s: %w", n.id, err)
	}
	return nil
}

func dispatchElem(ifName, chain string) nftables.SetElement {
	return nftables.SetElement{Key: ifname(ifName), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// setChunk is the most set elements one netlink message carries (an
// interval set takes two per prefix).
const setChunk = 512

// setStatic replaces the static set's content with prefixes (atomically).
// With flushDyn it also empties the resolver-admitted set.
func (m *Manager) setStatic(ctx context.Context, n sbNames, prefixes []netip.Prefix, flushDyn bool) error {
	err := m.apply(ctx, len(prefixes) > bigPolicy, func(c *nftables.Conn, ids *batchIDs) error {
		static, dyn := sandboxSets(m.table(), n, ids)
		return addStatic(c, n, static, dyn, prefixes, flushDyn)
	})
	if err != nil {
		return fmt.Errorf("update set %s: %w", n.static, err)
	}
	return nil
}

// addStatic adds to c the messages that replace the static set's content
// with prefixes (and empty the dynamic set, with flushDyn).
func addStatic(c *nftables.Conn, n sbNames, static, dyn *nftables.Set, prefixes []netip.Prefix, flushDyn bool) error {
	c.FlushSet(static)
	if flushDyn {
		c.FlushSet(dyn)
	}
	// In messages of at most setChunk elements, all in the one batch (one
	// transaction: the set is replaced whole or not at all). One message
	// of every element passes the kernel's netlink message size at a few
	// thousand prefixes (EMSGSIZE).
	elems := intervalElements(prefixes)
	for len(elems) > 0 {
		k := min(len(elems), setChunk)
		if err := c.SetAddElements(static, elems[:k]); err != nil {
			return fmt.Errorf("add elements to %s: %w", n.static, err)
		}
		elems = elems[k:]
	}
	return nil
}

// denyAll empties both sets: the fail-closed state. Each set is flushed
// in its own batch, so one missing set does not keep the other full.
//
// It holds dynMu (see Manager), so no admission lands after the flush
// for a policy stored before it. The caller holds mu.
func (m *Manager) denyAll(ctx context.Context, n sbNames) error {
	m.dynMu.Lock()
	defer m.dynMu.Unlock()
	defer m.forgetAdmitted(n.id)
	var errs []error
	for i, name := range []string{n.static, n.dyn} {
		err := m.apply(ctx, false, func(c *nftables.Conn, ids *batchIDs) error {
			static, dyn := sandboxSets(m.table(), n, ids)
			c.FlushSet([]*nftables.Set{static, dyn}[i])
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("flush set %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// admitted returns the addresses in the sandbox's dynamic set.
func (m *Manager) admitted(n sbNames) ([]netip.Addr, error) {
	c, err := m.nft()
	if err != nil {
		return nil, err
	}
	_, dyn := sandboxSets(m.table(), n, &batchIDs{})
	elems, err := c.GetSetElements(dyn)
	if err != nil {
		return nil, fmt.Errorf("list set %s: %w", n.dyn, err)
	}
	out := make([]netip.Addr, 0, len(elems))
	for _, e := range elems {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			out = append(out, a)
		}
	}
	return out, nil
}

// removeSandboxRules deletes the dispatch elements (with the gateway
// elements of gws), chain and sets of one sandbox in one batch, without listing anything, so its cost does
// not depend on how many sandboxes exist. Idempotent; the caller checks
// that the table exists.
//
// The usual case, everything present, is one batch of deletes. If that
// batch fails (something is already gone: a Teardown that stopped half
// way), a second batch first adds each object (a no-op when it exists,
// identical to what Setup makes) and then deletes it, so it succeeds
// whatever is left. The first batch is not always the second: adding an
// element that jumps makes the kernel validate the whole table's jump
// graph on commit, which costs in proportion to the number of sandboxes.
func (m *Manager) removeSandboxRules(ctx context.Context, n sbNames, gws []netip.Addr) error {
	if err := m.deleteSandboxObjects(ctx, n, gws, false); err == nil {
		return nil
	}
	return m.deleteSandboxObjects(ctx, n, gws, true)
}

func (m *Manager) deleteSandboxObjects(ctx context.Context, n sbNames, gws []netip.Addr, addFirst bool) error {
	err := m.apply(ctx, false, func(c *nftables.Conn, ids *batchIDs) error {
		return m.addDeletes(c, ids, n, gws, addFirst)
	})
	if err != nil {
		return fmt.Errorf("delete rules of %s: %w", n.id, err)
	}
	return nil
}

// addDeletes adds to c the messages that delete the sandbox's objects
// (after adding each, with addFirst).
func (m *Manager) addDeletes(c *nftables.Conn, ids *batchIDs, n sbNames, gws []netip.Addr, addFirst bool) error {
	t := m.table()
	out := &nftables.Chain{Name: n.out, Table: t}
	if addFirst {
		c.AddChain(out)
	}
	outMap, gwSet := m.dispatchSets(t)
	elems := []struct {
		s *nftables.Set
		e nftables.SetElement
	}{{outMap, dispatchElem(n.hostIf, n.out)}}
	for _, gw := range gws {
		elems = append(elems, struct {
			s *nftables.Set
			e nftables.SetElement
		}{gwSet, gatewayElem(n.hostIf, gw)})
	}
	for _, d := range elems {
		e := []nftables.SetElement{d.e}
		if addFirst {
			if err := c.SetAddElements(d.s, e); err != nil {
				return fmt.Errorf("delete element of %s from %s: %w", n.id, d.s.Name, err)
			}
		}
		if err := c.SetDeleteElements(d.s, e); err != nil {
			return fmt.Errorf("delete element of %s from %s: %w", n.id, d.s.Name, err)
		}
	}
	c.FlushChain(out)
	c.DelChain(out)
	static, dyn := sandboxSets(t, n, ids)
	for _, s := range []*nftables.Set{static, dyn} {
		if addFirst {
			if err := c.AddSet(s, nil); err != nil {
				return fmt.Errorf("delete set %s: %w", s.Name, err)
			}
		}
		c.DelSet(s)
	}
	return nil
}

// gatewaysOf lists the sandbox-gw elements of the veth ifName, for a
// Teardown that has no record to compute the gateway from. It reads the
// whole set: only on that rare path and for stale sandboxes in New.
func (m *Manager) gatewaysOf(ifName string) ([]netip.Addr, error) {
	c, err := m.nft()
	if err != nil {
		return nil, err
	}
	_, gwSet := m.dispatchSets(m.table())
	elems, err := c.GetSetElements(gwSet)
	if err != nil {
		return nil, fmt.Errorf("list set %s: %w", setGateway, err)
	}
	key := ifname(ifName)
	var out []netip.Addr
	for _, e := range elems {
		if len(e.Key) == len(key)+4 && bytes.Equal(e.Key[:len(key)], key) {
			out = append(out, netip.AddrFrom4([4]byte(e.Key[len(key):])))
		}
	}
	return out, nil
}

// legacyHostPrefix names the per-sandbox chains for traffic to the host
// that earlier versions made (shared input rules replace them), and
// legacyHostMap the verdict map that jumped to them in one of them.
const (
	legacyHostPrefix = "host-"
	legacyHostMap    = "sandbox-host"
)
