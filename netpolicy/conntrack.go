package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// cutFlows deletes the host namespace's conntrack entries of flows the
// sandbox at addr opened to destinations the policy no longer allows:
// prefixes, plus (unless flushedDyn) the addresses in its dynamic set;
// DNS to its own gateway always stays. Called after the sets were
// narrowed, so a packet of a cut flow arrives with no entry and is judged
// by the new sets: with nf_conntrack_tcp_loose=1 (the default) a TCP
// segment mid-stream is ct state new and is rejected with a reset, with
// nf_conntrack_tcp_loose=0 it is invalid and dropped; the peer's next
// segment finds no NAT binding and is answered by the host with a reset.
func (m *Manager) cutFlows(n sbNames, addr, gw netip.Addr, prefixes []netip.Prefix, flushedDyn bool) error {
	if m.skipCut {
		return nil
	}
	var dyn []netip.Addr
	if !flushedDyn {
		var err error
		if dyn, err = m.admitted(n); err != nil {
			return fmt.Errorf("cut revoked flows of %s: %w", n.id, err)
		}
	}
	f := &revokedFilter{src: addr, gw: gw, pool: m.cfg.Pool, prefixes: prefixes, dyn: dyn}
	if _, err := m.hostH.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f); err != nil {
		return fmt.Errorf("cut revoked flows of %s: %w", n.id, err)
	}
	return nil
}

// revokedFilter matches the conntrack entries of flows opened from src
// whose destination the policy does not allow.
type revokedFilter struct {
	src, gw  netip.Addr
	pool     netip.Prefix
	prefixes []netip.Prefix
	dyn      []netip.Addr
}

func (f *revokedFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, ok := netip.AddrFromSlice(flow.Forward.SrcIP)
	if !ok || src.Unmap() != f.src {
		return false
	}
	dst, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok {
		return true
	}
	dst = dst.Unmap()
	p := flow.Forward.Protocol
	if dst == f.gw && flow.Forward.DstPort == 53 && (p == unix.IPPROTO_UDP || p == unix.IPPROTO_TCP) {
		return false // the sandbox's resolver
	}
	if f.pool.Contains(dst) {
		return true // another sandbox or a gateway: never a destination
	}
	if slices.ContainsFunc(f.prefixes, func(p netip.Prefix) bool { return p.Contains(dst) }) {
		return false
	}
	return !slices.Contains(f.dyn, dst)
}
