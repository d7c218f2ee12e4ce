package netpolicy

// The table every sandbox shares: its base chains and rules, the dispatch
// maps, and the clean-up of what earlier versions or a lost state directory
// left in it. A sandbox's own chain, sets and map elements are in
// nft_sandbox.go; the rule expressions they are built from in nft_expr.go.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// legacyIfPrefix starts the name of every sandbox veth's host end in the
// table DefaultTable (the one every runnerd shared before each had its
// own). The base chains drop traffic from or to an interface with the
// table's prefix that no verdict map element dispatches, so a veth
// without rules is shut, never open.
//
// Several tables coexist in one network namespace, and a packet goes
// through the base chains of every one of them: an accept in one table
// does not spare it a drop in another. So each table's rules match only
// its own interfaces (its prefix) and its own pool (the masquerade): a
// table's catch-all drops never see another table's sandboxes. Prefixes
// must therefore never be prefixes of each other's names: DefaultTable's
// is "rn"; a table named TablePrefix+4 hex digits (what runnerd derives)
// has "r" and those digits ("n" is not a hex digit); any other name has
// "r" and 4 hex digits of its hash.
const legacyIfPrefix = "rn"

// TablePrefix starts the name of a table whose interface prefix is the 4
// lowercase hex digits that follow it (see legacyIfPrefix).
const TablePrefix = "runner-"

// IfPrefix is the prefix of the host-end veth names of the sandboxes in
// table: two tables with different prefixes never match each other's
// interfaces. runnerd refuses to start next to a runnerd whose table has
// the same prefix in the same namespace.
func IfPrefix(table string) string {
	if table == DefaultTable {
		return legacyIfPrefix
	}
	if tag, ok := strings.CutPrefix(table, TablePrefix); ok && len(tag) == 4 && isLowerHex(tag) {
		return "r" + tag
	}
	sum := sha256.Sum256([]byte(table))
	return "r" + hex.EncodeToString(sum[:2])
}

func isLowerHex(s string) bool {
	for _, r := range s {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

func (m *Manager) ifPrefix() string { return IfPrefix(m.cfg.Table) }

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
	c, err := nftables.New(nftables.WithNetNSFd(int(m.hostNS)), nftables.WithSockOptions(ackBuffer))
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	return c, nil
}

// nftRcvBuf is the receive buffer of an nftables connection: the kernel
// acknowledges every message of a transaction, and a rule writer's batch
// of ruleBatchOps sandboxes is ~640 messages whose acks (each an skb of
// ~1 KiB truesize) overflow the default buffer (ENOBUFS, the whole
// transaction's answer lost).
const nftRcvBuf = 4 << 20

// ackBuffer sizes a connection's receive buffer for a batch's acks:
// SO_RCVBUFFORCE (runnerd holds CAP_NET_ADMIN, which enforcing policies
// needs anyway), else SO_RCVBUF as far as net.core.rmem_max allows.
func ackBuffer(c *netlink.Conn) error {
	sc, err := c.SyscallConn()
	if err == nil {
		var serr error
		if cerr := sc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, nftRcvBuf)
		}); cerr == nil && serr == nil {
			return nil
		}
	}
	_ = c.SetReadBuffer(nftRcvBuf)
	return nil
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

// dispatchSets returns the verdict map that dispatches a sandbox's
// forwarded egress, and the set of (veth, gateway) pairs the shared input
// rules admit DNS for.
func (m *Manager) dispatchSets(t *nftables.Table) (out, gws *nftables.Set) {
	out = &nftables.Set{Table: t, Name: mapOut, ID: idMapOut, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	gws = &nftables.Set{Table: t, Name: setGateway, ID: idGateway, Concatenation: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
	return out, gws
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
	prefix := m.ifPrefix()
	add := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(exprs...)})
	}
	// forward: a sandbox's egress goes to its out-ID chain (which ends in
	// a verdict); a sandbox interface without an element is shut; towards
	// a sandbox only replies pass (nothing outside, and no other sandbox,
	// opens a connection to a sandbox).
	add(fwd, dispatchVMap(expr.MetaKeyIIFNAME, outMap))
	add(fwd, matchIfPrefix(expr.MetaKeyIIFNAME, prefix), verdict(expr.VerdictDrop))
	add(fwd, matchIfPrefix(expr.MetaKeyOIFNAME, prefix), matchCtEstablished(), verdict(expr.VerdictAccept))
	add(fwd, matchIfPrefix(expr.MetaKeyOIFNAME, prefix), verdict(expr.VerdictDrop))
	// input: a sandbox talking to the host itself (any of its addresses,
	// found by the input hook, not by address). Shared rules, no jump:
	// replies to connections the host opened, DNS to the sandbox's own
	// gateway (the pair veth . daddr is in sandbox-gw), otherwise reject.
	// The allowlist is never consulted, so no CIDR opens a host service.
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME, prefix), matchCtEstablished(), verdict(expr.VerdictAccept))
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME, prefix), matchIPv4(), matchL4Port(unix.IPPROTO_UDP, 53), matchOwnGateway(gws), verdict(expr.VerdictAccept))
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME, prefix), matchIPv4(), matchL4Port(unix.IPPROTO_TCP, 53), matchOwnGateway(gws), verdict(expr.VerdictAccept))
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME, prefix), rejectTCP())
	add(in, matchIfPrefix(expr.MetaKeyIIFNAME, prefix), rejectAny())
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

// legacyInPrefix names the per-sandbox chains for forwarded traffic
// towards a sandbox that earlier versions made (two shared rules replace
// them). New deletes them: after its rewrite of the base chains nothing
// jumps to them.
const legacyInPrefix = "in-"

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
