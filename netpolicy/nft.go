package netpolicy

import (
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
	"golang.org/x/sys/unix"
)

// Kernel object names of one sandbox. Everything is derived from the id,
// so Teardown finds the objects even when the persisted record is gone.
type sbNames struct {
	id      string
	hostIf  string // host end of the veth (IFNAMSIZ: at most 15 bytes)
	out     string // chain: forwarded traffic from the sandbox
	in      string // chain: forwarded traffic to the sandbox
	host    string // chain: traffic from the sandbox to the host itself
	static  string // set: addresses and CIDRs from the policy (interval)
	dyn     string // set: addresses admitted by the resolver (timeouts)
	comment string // rule comment on the dispatch rules in the base chains
}

func namesFor(id string) sbNames {
	sum := sha256.Sum256([]byte(id))
	return sbNames{
		id:      id,
		hostIf:  "rn" + hex.EncodeToString(sum[:])[:13],
		out:     "out-" + id,
		in:      "in-" + id,
		host:    "host-" + id,
		static:  "allow-" + id,
		dyn:     "dns-" + id,
		comment: "runner sandbox " + id,
	}
}

// Base chains of the table. They accept by default: they only dispatch a
// sandbox's traffic (matched by its veth) to that sandbox's chains, which
// end in a reject, and never change the fate of other traffic.
const (
	chainForward     = "forward"
	chainInput       = "input"
	chainPostrouting = "postrouting"
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

// ensureTable creates the table and its base chains if absent and
// rewrites the masquerade rule for the pool, in one atomic batch. It is
// idempotent: running it again changes nothing.
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
	// The postrouting chain holds only our masquerade rule: flush and
	// re-add, so a changed pool never leaves a stale rule behind.
	c.FlushChain(post)
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
// dispatch rules in one atomic batch. The chains are flushed and refilled
// in that batch, so re-running it after a restart never duplicates a rule
// and never opens a window without the final reject.
func (m *Manager) ensureSandboxRules(n sbNames, addr, gw netip.Addr) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	t := m.table()
	fwd, in, _ := m.baseChains(t)
	existing := map[string]bool{}
	for _, ch := range []*nftables.Chain{fwd, in} {
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return fmt.Errorf("list rules of %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			if s, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok {
				existing[ch.Name+"\x00"+s] = true
			}
		}
	}

	static := &nftables.Set{Table: t, Name: n.static, KeyType: nftables.TypeIPAddr, Interval: true}
	dyn := &nftables.Set{Table: t, Name: n.dyn, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	if err := c.AddSet(static, nil); err != nil {
		return fmt.Errorf("add set %s: %w", n.static, err)
	}
	if err := c.AddSet(dyn, nil); err != nil {
		return fmt.Errorf("add set %s: %w", n.dyn, err)
	}
	out := c.AddChain(&nftables.Chain{Name: n.out, Table: t})
	inc := c.AddChain(&nftables.Chain{Name: n.in, Table: t})
	host := c.AddChain(&nftables.Chain{Name: n.host, Table: t})
	c.FlushChain(out)
	c.FlushChain(inc)
	c.FlushChain(host)

	add := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(exprs...)})
	}
	// out: the sandbox's forwarded egress.
	add(out, matchIPv4(), matchAddr(12, addr, expr.CmpOpNeq), verdict(expr.VerdictDrop)) // anti-spoof
	add(out, matchCtEstablished(), verdict(expr.VerdictAccept))
	add(out, matchIPv4(), matchSet(16, static), verdict(expr.VerdictAccept))
	add(out, matchIPv4(), matchSet(16, dyn), verdict(expr.VerdictAccept))
	add(out, rejectTCP())
	add(out, rejectAny())
	// in: forwarded traffic towards the sandbox: replies only.
	add(inc, matchCtEstablished(), verdict(expr.VerdictAccept))
	add(inc, verdict(expr.VerdictDrop))
	// host: the sandbox talking to the host itself: replies, DNS to its
	// gateway resolver, and allowlisted host addresses.
	add(host, matchCtEstablished(), verdict(expr.VerdictAccept))
	add(host, matchIPv4(), matchAddr(16, gw, expr.CmpOpEq), matchL4Port(unix.IPPROTO_UDP, 53), verdict(expr.VerdictAccept))
	add(host, matchIPv4(), matchAddr(16, gw, expr.CmpOpEq), matchL4Port(unix.IPPROTO_TCP, 53), verdict(expr.VerdictAccept))
	add(host, matchIPv4(), matchSet(16, static), verdict(expr.VerdictAccept))
	add(host, matchIPv4(), matchSet(16, dyn), verdict(expr.VerdictAccept))
	add(host, rejectTCP())
	add(host, rejectAny())

	dispatch := func(base *nftables.Chain, key expr.MetaKey, to string) {
		if existing[base.Name+"\x00"+n.comment+" "+to] {
			return
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: base,
			UserData: userdata.AppendString(nil, userdata.TypeComment, n.comment+" "+to),
			Exprs: []expr.Any{
				&expr.Meta{Key: key, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(n.hostIf)},
				&expr.Verdict{Kind: expr.VerdictJump, Chain: to},
			}})
	}
	dispatch(fwd, expr.MetaKeyIIFNAME, n.out)
	dispatch(fwd, expr.MetaKeyOIFNAME, n.in)
	dispatch(in, expr.MetaKeyIIFNAME, n.host)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install rules for %s: %w", n.id, err)
	}
	return nil
}

// setStatic replaces the static set's content with prefixes (atomically).
// With flushDyn it also empties the resolver-admitted set.
func (m *Manager) setStatic(n sbNames, prefixes []netip.Prefix, flushDyn bool) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	t := m.table()
	static := &nftables.Set{Table: t, Name: n.static, KeyType: nftables.TypeIPAddr, Interval: true}
	c.FlushSet(static)
	if flushDyn {
		c.FlushSet(&nftables.Set{Table: t, Name: n.dyn, KeyType: nftables.TypeIPAddr, HasTimeout: true})
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
	for _, s := range []*nftables.Set{
		{Table: m.table(), Name: n.static, KeyType: nftables.TypeIPAddr, Interval: true},
		{Table: m.table(), Name: n.dyn, KeyType: nftables.TypeIPAddr, HasTimeout: true},
	} {
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

// admit adds resolver answers to the sandbox's dynamic set with a
// lifetime derived from ttl. An element already present is replaced so
// its timeout restarts.
func (m *Manager) admit(n sbNames, addrs []netip.Addr, ttl time.Duration) error {
	if len(addrs) == 0 {
		return nil
	}
	ttl = max(minAdmitTTL, min(ttl, maxAdmitTTL))
	dyn := &nftables.Set{Table: m.table(), Name: n.dyn, KeyType: nftables.TypeIPAddr, HasTimeout: true}
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

// removeSandboxRules deletes the dispatch rules, chains and sets of one
// sandbox. Objects already absent are skipped, so it is idempotent.
func (m *Manager) removeSandboxRules(n sbNames) error {
	c, err := m.nft()
	if err != nil {
		return err
	}
	t := m.table()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == t.Name }) {
		return nil
	}
	fwd, in, _ := m.baseChains(t)
	for _, ch := range []*nftables.Chain{fwd, in} {
		rules, err := c.GetRules(t, ch)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("list rules of %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			if s, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && strings.HasPrefix(s, n.comment+" ") {
				if err := c.DelRule(r); err != nil {
					return fmt.Errorf("delete rule: %w", err)
				}
			}
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == t.Name && (ch.Name == n.out || ch.Name == n.in || ch.Name == n.host) {
			c.FlushChain(ch)
			c.DelChain(ch)
		}
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		if s.Name == n.static || s.Name == n.dyn {
			c.DelSet(s)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete rules of %s: %w", n.id, err)
	}
	return nil
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
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
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
