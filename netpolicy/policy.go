package netpolicy

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/agentrunner/runner/wire"
)

// Policy is a sandbox's egress allowlist. The zero Policy (empty Allow)
// denies every destination: it is never a no-op.
type Policy struct {
	// Allow lists what the sandbox may reach. Each entry is one of:
	//   - a hostname ("api.example.com"), resolvable only through the
	//     sandbox's gateway resolver, whose answers are admitted;
	//   - a wildcard "*.example.com", matching every name strictly below
	//     example.com (not example.com itself);
	//   - "*": every name resolves, but its answers admit nothing: what
	//     a sandbox with "*" reaches is what its addresses and CIDRs
	//     allow (a name matched only by "*" could be any address, so
	//     admitting its answers would open every address to whoever
	//     owns a domain, and costs a kernel update per answer);
	//   - an IPv4 address ("192.0.2.7");
	//   - an IPv4 CIDR ("192.0.2.0/24").
	// All ports and protocols of an admitted address are allowed. IPv6
	// entries and "host:port" entries are refused with ErrInvalidPolicy:
	// a sandbox has IPv4 addressing only, and port filtering is not
	// implemented, so accepting them would pretend. So is an address or
	// CIDR inside LinkLocal: link-local is never a destination (below).
	//
	// Never a destination, whatever Allow holds: the host (any of its
	// addresses), the pool (other sandboxes), and LinkLocal (a cloud's
	// metadata service and its credentials at 169.254.169.254). A CIDR
	// that covers one of them ("0.0.0.0/0") opens the rest only.
	Allow []string `json:"allow"`
}

// LinkLocal is IPv4 link-local, 169.254.0.0/16: on a cloud host the
// metadata service (169.254.169.254, with the instance's credentials)
// and, on others, whatever the uplink's neighbours answer there. No
// sandbox ever reaches it: an allowlist entry inside it is refused, the
// resolver never admits an answer in it, and the sandbox's chain rejects
// it before the allowlist is read. (fe80::/10 needs no rule: sandboxes
// have no IPv6 route and IPv6 entries are refused.)
var LinkLocal = netip.MustParsePrefix("169.254.0.0/16")

// MaxEntries is the most entries a Policy may list (after duplicates are
// removed). The addresses and CIDRs of a policy are replaced in the
// kernel in one nftables transaction, and that batch must fit one
// netlink send: about 8,000 prefixes do not. A longer policy is refused
// with ErrInvalidPolicy before anything changes, never accepted and
// left unenforced; hostnames count too, so the bound is one number.
const MaxEntries = 4096

// OpenEgress is the policy of a sandbox whose egress is open: every name
// resolves and every IPv4 destination outside the host and the pool is
// reachable. The host (every address of it) and other sandboxes stay
// unreachable whatever a policy says.
func OpenEgress() Policy { return Policy{Allow: []string{"*", "0.0.0.0/0"}} }

// PublicEgress is OpenEgress without the private networks: every name
// resolves and every IPv4 destination outside wire.PrivatePrefixes (RFC
// 1918 and RFC 6598's 100.64/10, where an operator's internal network
// lives; and, as always, the host, the pool and LinkLocal) is reachable.
// It is "*" and the CIDRs that cover the rest of the IPv4 space, so the
// policy shown is the policy enforced. The list is wire.PublicEgress, so a
// client recognises it (wire.IsPublicEgress) without importing this
// package.
func PublicEgress() Policy { return Policy{Allow: wire.PublicEgress()} }

// ErrInvalidPolicy is returned (wrapped) by SetPolicy and ParsePolicy when
// an allowlist entry is malformed or names something the package does not
// enforce.
var ErrInvalidPolicy = errors.New("invalid network policy")

// parsedPolicy is a validated, normalized Policy.
type parsedPolicy struct {
	norm     Policy         // entries normalized, duplicates removed, input order kept
	prefixes []netip.Prefix // static addresses and CIDRs (masked, IPv4)
	names    map[string]bool
	wild     []string    // suffixes, each starting with "." ("*.a.b" -> ".a.b")
	allNames bool        // "*": every name
	ranges   []addrRange // prefixes merged, sorted: covers' binary search
}

// addrRange is an IPv4 range [lo, hi) as numbers (hi 1<<32 is the end).
type addrRange struct{ lo, hi uint64 }

// ParsePolicy validates p and returns it normalized: entries lowercased,
// trailing dots and duplicates removed, CIDRs masked. It returns an error
// wrapping ErrInvalidPolicy naming the first bad entry.
func ParsePolicy(p Policy) (Policy, error) {
	pp, err := parsePolicy(p)
	if err != nil {
		return Policy{}, err
	}
	return pp.norm, nil
}

func parsePolicy(p Policy) (*parsedPolicy, error) {
	pp := &parsedPolicy{names: map[string]bool{}, norm: Policy{Allow: []string{}}}
	seen := map[string]bool{}
	for _, raw := range p.Allow {
		e := strings.ToLower(strings.TrimSpace(raw))
		if e == "" {
			return nil, fmt.Errorf("entry %q: empty: %w", raw, ErrInvalidPolicy)
		}
		var norm string
		switch {
		case e == "*":
			pp.allNames = true
			norm = e
		case strings.Contains(e, "/"):
			pfx, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("entry %q: not a CIDR: %w", raw, ErrInvalidPolicy)
			}
			if !pfx.Addr().Is4() {
				return nil, fmt.Errorf("entry %q: IPv6 is not supported (sandboxes are IPv4-only): %w", raw, ErrInvalidPolicy)
			}
			pfx = pfx.Masked()
			if LinkLocal.Bits() <= pfx.Bits() && LinkLocal.Contains(pfx.Addr()) {
				return nil, fmt.Errorf("entry %q: link-local (%s: a cloud's metadata service) is never a destination: %w", raw, LinkLocal, ErrInvalidPolicy)
			}
			pp.prefixes = append(pp.prefixes, pfx)
			norm = pfx.String()
		case strings.Contains(e, ":"):
			if a, err := netip.ParseAddr(strings.Trim(e, "[]")); err == nil && a.Is6() && !a.Is4In6() {
				return nil, fmt.Errorf("entry %q: IPv6 is not supported (sandboxes are IPv4-only): %w", raw, ErrInvalidPolicy)
			}
			return nil, fmt.Errorf("entry %q: ports are not supported, allow the host: %w", raw, ErrInvalidPolicy)
		default:
			if a, err := netip.ParseAddr(e); err == nil {
				if !a.Is4() {
					return nil, fmt.Errorf("entry %q: not an IPv4 address: %w", raw, ErrInvalidPolicy)
				}
				if LinkLocal.Contains(a) {
					return nil, fmt.Errorf("entry %q: link-local (%s: a cloud's metadata service) is never a destination: %w", raw, LinkLocal, ErrInvalidPolicy)
				}
				pp.prefixes = append(pp.prefixes, netip.PrefixFrom(a, 32))
				norm = a.String()
				break
			}
			name := strings.TrimSuffix(e, ".")
			wild := strings.HasPrefix(name, "*.")
			if wild {
				name = name[2:]
			}
			if err := checkHostname(name); err != nil {
				return nil, fmt.Errorf("entry %q: %v: %w", raw, err, ErrInvalidPolicy)
			}
			if wild {
				pp.wild = append(pp.wild, "."+name)
				norm = "*." + name
			} else {
				pp.names[name] = true
				norm = name
			}
		}
		if !seen[norm] {
			seen[norm] = true
			pp.norm.Allow = append(pp.norm.Allow, norm)
			if len(pp.norm.Allow) > MaxEntries {
				return nil, fmt.Errorf("more than %d entries (the most a policy may list): %w", MaxEntries, ErrInvalidPolicy)
			}
		}
	}
	pp.ranges = mergeRanges(pp.prefixes)
	return pp, nil
}

// mergeRanges turns prefixes into sorted ranges, merging overlapping and
// adjacent ones.
func mergeRanges(prefixes []netip.Prefix) []addrRange {
	var rs []addrRange
	for _, p := range prefixes {
		p = p.Masked()
		lo := uint64(addrNum(p.Addr()))
		rs = append(rs, addrRange{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return cmp.Compare(a.lo, b.lo) })
	var merged []addrRange
	for _, r := range rs {
		if k := len(merged); k > 0 && r.lo <= merged[k-1].hi {
			merged[k-1].hi = max(merged[k-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	return merged
}

func addrNum(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// covers reports whether the policy's addresses and CIDRs hold a (an
// IPv4 address): the static set already admits it.
func (pp *parsedPolicy) covers(a netip.Addr) bool {
	if pp == nil || !a.Is4() {
		return false
	}
	v := uint64(addrNum(a))
	i := sort.Search(len(pp.ranges), func(i int) bool { return pp.ranges[i].hi > v })
	return i < len(pp.ranges) && pp.ranges[i].lo <= v
}

// rangesWithin reports whether every address pp's CIDRs and addresses
// hold, q's hold too: a change from pp to q revokes no static
// destination.
func (pp *parsedPolicy) rangesWithin(q *parsedPolicy) bool {
	for _, r := range pp.ranges {
		i := sort.Search(len(q.ranges), func(i int) bool { return q.ranges[i].hi > r.lo })
		if i == len(q.ranges) || q.ranges[i].lo > r.lo || r.hi > q.ranges[i].hi {
			return false
		}
	}
	return true
}

// checkHostname accepts a lowercased name of LDH labels (underscores are
// tolerated, as in SRV-style names) that is not all-numeric at the top.
func checkHostname(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("not a hostname")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return errors.New("not a hostname (bad label length)")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return errors.New("not a hostname (label starts or ends with '-')")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("not a hostname (character %q)", c)
			}
		}
	}
	top := labels[len(labels)-1]
	if strings.Trim(top, "0123456789") == "" {
		return errors.New("not a hostname (numeric top-level label)")
	}
	return nil
}

// allowsName reports whether the DNS name q (lowercase, no trailing dot)
// is admitted by the policy.
func (pp *parsedPolicy) allowsName(q string) bool {
	if pp == nil {
		return false
	}
	if pp.names[q] || pp.allNames {
		return true
	}
	for _, s := range pp.wild {
		if strings.HasSuffix(q, s) {
			return true
		}
	}
	return false
}

// admitsAnswers reports whether the resolver admits the answers for q
// into the dynamic set: q is named by an entry or a "*.suffix" wildcard.
// A name that only "*" allows resolves, but admits nothing.
func (pp *parsedPolicy) admitsAnswers(q string) bool {
	if pp == nil {
		return false
	}
	if pp.names[q] {
		return true
	}
	for _, s := range pp.wild {
		if strings.HasSuffix(q, s) {
			return true
		}
	}
	return false
}

// namesSubsetOf reports whether every name whose answers pp admits is
// admitted by other too, i.e. changing from pp to other revokes no
// resolver-admitted address. ("*" admits no answer, so it counts for
// neither side.)
func (pp *parsedPolicy) namesSubsetOf(other *parsedPolicy) bool {
	for n := range pp.names {
		if !other.admitsAnswers(n) {
			return false
		}
	}
	for _, w := range pp.wild {
		found := false
		for _, o := range other.wild {
			if strings.HasSuffix(w, o) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
