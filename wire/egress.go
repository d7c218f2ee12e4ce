package wire

import (
	"net/netip"
	"sync"
)

// The default policy of a contained sandbox is written here, once, because
// both sides need it: runnerd gives it to a sandbox created without a
// policy (netpolicy.PublicEgress), and a client that shows a sandbox names
// it in a few words instead of printing its 39 entries.

// privatePrefixes are the IPv4 ranges of private networks: RFC 1918
// (10/8, 172.16/12, 192.168/16) and the shared address space of RFC 6598
// (100.64/10: carrier-grade NAT, some clouds' internal services, VPN
// overlays). An operator's internal network lives there.
var privatePrefixes = [...]netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
}

// PrivatePrefixes returns the IPv4 ranges of private networks, which
// PublicEgress leaves out: 10.0.0.0/8, 100.64.0.0/10, 172.16.0.0/12 and
// 192.168.0.0/16. The slice is the caller's.
func PrivatePrefixes() []netip.Prefix { return append([]netip.Prefix(nil), privatePrefixes[:]...) }

// publicEgress is "*" and the CIDRs of PublicEgress, computed once.
var publicEgress = sync.OnceValue(func() []string {
	allow := []string{"*"}
	for _, p := range complement(privatePrefixes[:]) {
		allow = append(allow, p.String())
	}
	return allow
})

// PublicEgress returns the allow list of a sandbox whose egress is open to
// public addresses only: "*" (every name resolves) and the fewest CIDRs
// that cover the IPv4 space outside PrivatePrefixes, in address order (38
// of them). It is the network runnerd gives a sandbox created without one
// under its default --egress-private deny, and what Sandbox.Network then
// holds. (Under --egress-private allow it is {"*", "0.0.0.0/0"}.) Whatever
// a policy lists, runnerd never lets a sandbox reach the host, another
// sandbox or link-local 169.254.0.0/16 (a cloud's metadata service). The
// slice is the caller's.
func PublicEgress() []string { return append([]string(nil), publicEgress()...) }

// IsPublicEgress reports whether allow is PublicEgress's list, in any
// order: a sandbox with runnerd's default policy. A client shows such a
// sandbox's network in words ("every public address") rather than as 39
// entries; allow is compared as runnerd reports it (normalized), so a list
// that says the same in other words (a different split into CIDRs, an
// extra host) is not recognised and is shown as it is.
func IsPublicEgress(allow []string) bool {
	want := publicEgress()
	if len(allow) != len(want) {
		return false
	}
	set := make(map[string]bool, len(want))
	for _, a := range want {
		set[a] = true
	}
	for _, a := range allow {
		if !set[a] {
			return false
		}
		delete(set, a) // a duplicate then misses: len(allow) entries, each once
	}
	return true
}

// complement returns the fewest CIDRs that cover the IPv4 space outside
// excl, in address order.
func complement(excl []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	var walk func(p netip.Prefix)
	walk = func(p netip.Prefix) {
		for _, e := range excl {
			if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
				return // p inside an excluded range
			}
		}
		overlaps := false
		for _, e := range excl {
			if p.Overlaps(e) {
				overlaps = true
			}
		}
		if !overlaps {
			out = append(out, p)
			return
		}
		lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
		a := p.Addr().As4()
		v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		v |= 1 << (31 - p.Bits())
		hi := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), p.Bits()+1)
		walk(lo)
		walk(hi)
	}
	walk(netip.MustParsePrefix("0.0.0.0/0"))
	return out
}
