package netpolicy

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
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

func namesFor(id string) sbNames {
	sum := sha256.Sum256([]byte(id))
	return sbNames{
		id:     id,
		hostIf: hostIfPrefix + hex.EncodeToString(sum[:])[:13],
		out:    "out-" + id,
		static: "allow-" + id,
		dyn:    "dns-" + id,
	}
}

// hostIfPrefix starts the name of every sandbox veth's host end. The base
// chains drop traffic from or to an interface with this prefix that no
// verdict map element dispatches, so a veth without rules is shut, never
// open.
const hostIfPrefix = "rn"

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

func (m *Manager) table() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
}

// nft opens a fresh netlink connection in the host namespace. A Conn
// batches messages until Flush, so each operation gets its own and
// concurrent operations (resolver, SetPolicy) never mix batches.
func (m *Manager) nft() (*nftables.Conn, error) {
	if m.dialNFT != nil {
		return m.dialNFT()
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(m.hostNS)))
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	return c, nil
}

func (m *Manager) baseChains(t *nftables.Table) (fwd, in, post *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	fwd = &nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	in = &nftables.Chain{Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	post = &nftables.Chain{Name: chainPostrouting, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}
	return fwd, in, post
}

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
)

// dispatchSets returns the verdict map that dispatches a sandbox's
// forwarded egress, and the set of (veth, gateway) pairs the shared input
// rules admit DNS for.
func (m *Manager) dispatchSets(t *nftables.Table) (out, gws *nftables.Set) {
	out = &nftables.Set{Table: t, Name: mapOut, ID: idMapOut, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	gws = &nftables.Set{Table: t, Name: setGateway, ID: idGateway, Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
	return out, gws
}

// gatewayElem is the sandbox-gw element of a sandbox: its veth's name
// (16 bytes, NUL-padded) followed by its gateway address.
func gatewayElem(ifName string, gw netip.Addr) nftables.SetElement {
	return nftables.SetElement{Key: append(ifname(ifName), gw.AsSlice()...)}
}

func sandboxSets(t *nftables.Table, n sbNames) (static, dyn *nftables.Set) {
	static = &nftables.Set{Table: t, Name: n.static, ID: idStatic, KeyType: nftables.TypeIPAddr, Interval: true}
	dyn = &nftables.Set{Table: t, Name: n.dyn, ID: idDyn, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	return static, dyn
}

// ensureTable creates the table, its base chains and dispatch maps if
// absent and rewrites the base chains' rules and the masquerade rule, in
// one atomic batch. It is idempotent: running it again changes nothing.
// The maps keep their elements, so sandboxes stay dispatched throughout;
// the dispatch rules of earlier versions (one per sandbox) go, and a
// sandbox they served is denied (the rn* drop) until Setup re-adopts it
// (New then deletes the legacy chains those rules jumped to).
func (m *Manager) ensureTable() error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	t := c.AddTable(m.table())
	fwd, in, post := m.baseChains(t)
	c.AddChain(fwd)
	c.AddChain(in)
	c.AddChain(post)
	outMap, gws := m.dispatchSets(t)
	if err := c.AddSet(outMap, nil); err != nil {
		return fmt.Errorf("add map %s: %w", mapOut, err)
	}
	if err := c.AddSet(gws, nil); err != nil {
		return fmt.Errorf("add set %s: %w", setGateway, err)
	}
	c.FlushChain(fwd)
	c.FlushChain(in)
	c.FlushChain(post)
	// An earlier layout's input dispatch map: add (a no-op if it exists)
	// and delete; nothing refers to it once the input chain is flushed.
	legacy := &nftables.Set{Table: t, Name: legacyHostMap, ID: idLegacyHostMap, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	if err := c.AddSet(legacy, nil); err != nil {
		return fmt.Errorf("delete map %s: %w", legacyHostMap, err)
	}
	c.DelSet(legacy)
	add := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(exprs...)})
	}
	// forward: a sandbox's egress goes to its out-ID chain (which ends in
	// a verdict); a sandbox interface without an element is shut; towards
	// a sandbox only replies pass (nothing outside, and no other sandbox,
	// opens a connection to a sandbox).
	add(fwd, dispatchVMap(expr.MetaKeyIIFNAME, outMap))
	add(fwd, matchIfPrefix(expr.MetaKeyIIFNAME), verdict(expr.VerdictDrop))
	add(fwd, matchIfPrefix(expr.MetaKeyOIFNAME), matchCtEstablished(), verdict(expr.VerdictAccept))
	add(fwd, matchIfPrefix(expr.MetaKeyOIFNAME), verdict(expr.VerdictDrop))
	// input: a sandbox talking to the host itself (any of its addresses,
	// found by the input hook, not by address). Shared rules, no jump:
	// replies to connections the host opened, DNS to the sandbox's own
	// gateway (the pair veth . daddr is in sandbox-gw), otherwise reject.
	// The allowlist is never consulted, so no CIDR opens a host service.
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME), matchCtEstablished(), verdict(expr.VerdictAccept))
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME), matchIPv4(), matchL4Port(unix.IPPROTO_UDP, 53), matchOwnGateway(gws), verdict(expr.VerdictAccept))
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME), matchIPv4(), matchL4Port(unix.IPPROTO_TCP, 53), matchOwnGateway(gws), verdict(expr.VerdictAccept))
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME), rejectTCP())
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME), rejectAny())
	// postrouting: masquerade what leaves the pool.
	pool := m.cfg.Pool
	mask := net4Mask(pool.Bits())
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: concat(
		matchIPv4(),
		// ip saddr & mask == pool
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pool.Addr().AsSlice()},
			// ip daddr & mask != pool: sandbox to host/gateway is not NATed
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: pool.Addr().AsSlice()},
			&expr.Masq{},
		}),
		UserData: userdata.AppendString(nil, userdata.TypeComment, "runner masquerade "+pool.String()),
	})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("create table %s: %w", m.cfg.Table, err)
	}
	return nil
}

// ensureSandboxRules creates (or rewrites) the sandbox's sets, chains and
// dispatch map elements in one atomic batch. The chains are flushed and
// refilled in that batch, so re-running it after a restart never
// duplicates a rule and never opens a window without the final reject.
// Its cost does not depend on how many other sandboxes exist: it reads
// nothing and writes only this sandbox's objects.
func (m *Manager) ensureSandboxRules(n sbNames, addr, gw netip.Addr) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	t := m.table()
	static, dyn := sandboxSets(t, n)
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
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install rules for %s: %w", n.id, err)
	}
	return nil
}

// verdictChain returns the chain of a verdict map element's data as the
// library returns it on a listing: the NFTA_DATA_VERDICT attributes
// (code, chain). Empty when there is none.
func verdictChain(val []byte) string {
	ad, err := netlink.NewAttributeDecoder(val)
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			return strings.TrimRight(string(ad.Bytes()), "\x00")
		}
	}
	return ""
}

func dispatchElem(ifName, chain string) nftables.SetElement {
	return nftables.SetElement{Key: ifname(ifName), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

// setStatic replaces the static set's content with prefixes (atomically).
// With flushDyn it also empties the resolver-admitted set.
func (m *Manager) setStatic(n sbNames, prefixes []netip.Prefix, flushDyn bool) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	static, dyn := sandboxSets(m.table(), n)
	c.FlushSet(static)
	if flushDyn {
		c.FlushSet(dyn)
	}
	if elems := intervalElements(prefixes); len(elems) > 0 {
		if err := c.SetAddElements(static, elems); err != nil {
			return fmt.Errorf("add elements to %s: %w", n.static, err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("update set %s: %w", n.static, err)
	}
	return nil
}

// denyAll empties both sets: the fail-closed state. Each set is flushed
// in its own batch, so one missing set does not keep the other full.
func (m *Manager) denyAll(n sbNames) error {
	var errs []error
	static, dyn := sandboxSets(m.table(), n)
	for _, s := range []*nftables.Set{static, dyn} {
		c, err := m.nft()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.FlushSet(s)
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("flush set %s: %w", s.Name, err))
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
	_, dyn := sandboxSets(m.table(), n)
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

// admit adds resolver answers to the sandbox's dynamic set with a
// lifetime derived from ttl. An element already present is replaced so
// its timeout restarts.
func (m *Manager) admit(n sbNames, addrs []netip.Addr, ttl time.Duration) error {
	if len(addrs) == 0 {
		return nil
	}
	ttl = max(m.minAdmitTTL, min(ttl, m.maxAdmitTTL))
	_, dyn := sandboxSets(m.table(), n)
	elems := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		elems = append(elems, nftables.SetElement{Key: a.AsSlice(), Timeout: ttl})
	}
	c, err := m.nft()
	if err != nil {
		return err
	}
	// Delete-then-add restarts the timeout of present elements. The
	// delete fails the whole batch when an element is absent, so fall
	// back to adding one by one.
	if err := c.SetDeleteElements(dyn, elems); err == nil {
		if err := c.SetAddElements(dyn, elems); err == nil {
			if c.Flush() == nil {
				return nil
			}
		}
	}
	for _, e := range elems {
		c, err := m.nft()
		if err != nil {
			return err
		}
		if err := c.SetDeleteElements(dyn, []nftables.SetElement{e}); err != nil {
			return fmt.Errorf("admit %v: %w", e.Key, err)
		}
		if err := c.SetAddElements(dyn, []nftables.SetElement{e}); err != nil {
			return fmt.Errorf("admit %v: %w", e.Key, err)
		}
		if c.Flush() == nil {
			continue
		}
		c, err = m.nft()
		if err != nil {
			return err
		}
		if err := c.SetAddElements(dyn, []nftables.SetElement{e}); err != nil {
			return fmt.Errorf("admit %v: %w", e.Key, err)
		}
		if err := c.Flush(); err != nil {
			return fmt.Errorf("admit %v into %s: %w", netip.AddrFrom4([4]byte(e.Key)), n.dyn, err)
		}
	}
	return nil
}

// tableExists reports whether the Manager's table is in the kernel.
func (m *Manager) tableExists() (bool, error) {
	c, err := m.nft()
	if err != nil {
		return false, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("list tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == m.cfg.Table }), nil
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
func (m *Manager) removeSandboxRules(n sbNames, gws []netip.Addr) error {
	if err := m.deleteSandboxObjects(n, gws, false); err == nil {
		return nil
	}
	return m.deleteSandboxObjects(n, gws, true)
}

func (m *Manager) deleteSandboxObjects(n sbNames, gws []netip.Addr, addFirst bool) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
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
	static, dyn := sandboxSets(t, n)
	for _, s := range []*nftables.Set{static, dyn} {
		if addFirst {
			if err := c.AddSet(s, nil); err != nil {
				return fmt.Errorf("delete set %s: %w", s.Name, err)
			}
		}
		c.DelSet(s)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete rules of %s: %w", n.id, err)
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

// legacyInPrefix names the per-sandbox chains for forwarded traffic
// towards a sandbox that earlier versions made (two shared rules replace
// them). New deletes them: after its rewrite of the base chains nothing
// jumps to them.
const legacyInPrefix = "in-"

// legacyHostPrefix names the per-sandbox chains for traffic to the host
// that earlier versions made (shared input rules replace them), and
// legacyHostMap the verdict map that jumped to them in one of them.
const (
	legacyHostPrefix = "host-"
	legacyHostMap    = "sandbox-host"
)

// removeLegacyChains deletes every legacy in-ID chain of the table in one
// batch. It lists the table's chains: once per New, never per sandbox.
func (m *Manager) removeLegacyChains() error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	found := false
	for _, ch := range chains {
		if ch.Table.Name == m.cfg.Table && (strings.HasPrefix(ch.Name, legacyInPrefix) || strings.HasPrefix(ch.Name, legacyHostPrefix)) {
			c.FlushChain(ch)
			c.DelChain(ch)
			found = true
		}
	}
	if !found {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete legacy chains: %w", err)
	}
	return nil
}

// staleSandboxes returns the ids whose dispatch elements are in the
// kernel but that have no record: sandboxes torn down while a Manager was
// not running to the end, or left by a lost state directory.
func (m *Manager) staleSandboxes() ([]string, error) {
	c, err := m.nft()
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for id := range m.records {
		known[id] = true
	}
	var stale []string
	outMap, _ := m.dispatchSets(m.table())
	elems, err := c.GetSetElements(outMap)
	if err != nil {
		return nil, fmt.Errorf("list map %s: %w", outMap.Name, err)
	}
	for _, e := range elems {
		id, ok := strings.CutPrefix(verdictChain(e.Val), "out-")
		if ok && checkID(id) == nil && !known[id] && !slices.Contains(stale, id) {
			stale = append(stale, id)
		}
	}
	return stale, nil
}

// intervalElements turns prefixes into interval-set elements, merging
// overlapping and adjacent ranges (the kernel rejects overlaps).
func intervalElements(prefixes []netip.Prefix) []nftables.SetElement {
	type rng struct{ lo, hi uint64 } // hi exclusive; 1<<32 means "to the end"
	var rs []rng
	for _, p := range prefixes {
		p = p.Masked()
		lo := uint64(binary.BigEndian.Uint32(p.Addr().AsSlice()))
		rs = append(rs, rng{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(rs, func(a, b rng) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	var merged []rng
	for _, r := range rs {
		if k := len(merged); k > 0 && r.lo <= merged[k-1].hi {
			merged[k-1].hi = max(merged[k-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	var out []nftables.SetElement
	for _, r := range merged {
		out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(r.lo))})
		if r.hi < 1<<32 {
			out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(r.hi)), IntervalEnd: true})
		}
	}
	return out
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func matchIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// matchAddr compares the IPv4 header field at off (12 saddr, 16 daddr).
func matchAddr(off uint32, a netip.Addr, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Cmp{Op: op, Register: 1, Data: a.AsSlice()},
	}
}

// matchPrefix matches the IPv4 header field at off against prefix p.
func matchPrefix(off uint32, p netip.Prefix) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net4Mask(p.Bits()), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// matchIfPrefix matches an interface name (iifname or oifname) that
// starts with hostIfPrefix, like nft's `iifname "rn*"`.
func matchIfPrefix(key expr.MetaKey) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(hostIfPrefix)},
	}
}

// dispatchVMap is `iifname vmap @m` (or oifname): one hash lookup whose
// result is the verdict, a jump to the sandbox's chain.
func dispatchVMap(key expr.MetaKey, m *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
	}
}

// matchOwnGateway matches a packet whose pair (input interface,
// destination address) is in gws: `iifname . ip daddr @sandbox-gw`. The
// key is built in the 32-bit registers: the name in 8-11, the address in
// 12.
func matchOwnGateway(gws *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 8},
		&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 8, SetName: gws.Name, SetID: gws.ID},
	}
}

func matchSet(off uint32, s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
	}
}

func matchL4Port(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func matchCtEstablished() []expr.Any {
	return matchCtState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
}

// matchCtState matches a packet whose conntrack state is one of bits.
func matchCtState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}

// rejectTCP answers a TCP packet with a reset, so a denied connect fails
// at once ("connection refused") instead of hanging.
func rejectTCP() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}
}

// rejectAny answers with ICMP(v6) administratively prohibited.
func rejectAny() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func net4Mask(bits int) []byte {
	return binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-bits))
}
