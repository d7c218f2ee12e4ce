package wire

import (
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestPublicEgress: "*" then CIDRs, in address order, that cover exactly
// the IPv4 space outside the private ranges: not one address of them,
// every address else (counted), and none twice.
func TestPublicEgress(t *testing.T) {
	allow := PublicEgress()
	if len(allow) != 39 || allow[0] != "*" {
		t.Fatalf("PublicEgress() = %d entries starting %q, want 39 starting \"*\": %v", len(allow), allow[0], allow)
	}
	var (
		total uint64
		prev  netip.Prefix
	)
	for i, s := range allow[1:] {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() || p.Masked() != p {
			t.Fatalf("entry %q: not a masked IPv4 CIDR (%v)", s, err)
		}
		if i > 0 && (prev.Overlaps(p) || p.Addr().Less(prev.Addr())) {
			t.Errorf("entry %s overlaps or precedes %s", p, prev)
		}
		for _, priv := range PrivatePrefixes() {
			if p.Overlaps(priv) {
				t.Errorf("entry %s overlaps the private range %s", p, priv)
			}
		}
		total += 1 << (32 - p.Bits())
		prev = p
	}
	private := uint64(1<<24 + 1<<22 + 1<<20 + 1<<16) // 10/8, 100.64/10, 172.16/12, 192.168/16
	if want := uint64(1<<32) - private; total != want {
		t.Errorf("the CIDRs hold %d addresses, want %d (all IPv4 but the private ranges)", total, want)
	}
}

// TestEgressListsAreCopies: a caller that edits what it got cannot change
// the default policy runnerd gives the next sandbox.
func TestEgressListsAreCopies(t *testing.T) {
	a := PublicEgress()
	a[0], a[1] = "evil.example", "10.0.0.0/8"
	if b := PublicEgress(); b[0] != "*" || b[1] == "10.0.0.0/8" || !IsPublicEgress(b) {
		t.Errorf("PublicEgress() after an edit of an earlier result = %v", b[:2])
	}
	p := PrivatePrefixes()
	p[0] = netip.MustParsePrefix("0.0.0.0/0")
	if got := PrivatePrefixes()[0]; got != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("PrivatePrefixes()[0] after an edit = %s, want 10.0.0.0/8", got)
	}
}

// TestIsPublicEgress: the default list in any order, and nothing else.
func TestIsPublicEgress(t *testing.T) {
	pub := PublicEgress()
	reversed := slices.Clone(pub)
	slices.Reverse(reversed)
	dup := slices.Clone(pub)
	dup[5] = dup[6]
	noStar := slices.Clone(pub)
	noStar[0] = "example.com"
	for _, tc := range []struct {
		name  string
		allow []string
		want  bool
	}{
		{"default", pub, true},
		{"reversed", reversed, true},
		{"nil", nil, false},
		{"empty", []string{}, false},
		{"open egress", []string{"*", "0.0.0.0/0"}, false},
		{"one CIDR missing", pub[:len(pub)-1], false},
		{"one more entry", append(slices.Clone(pub), "10.0.0.0/8"), false},
		{"a duplicate for a CIDR", dup, false},
		{"a name for *", noStar, false},
		{"CIDRs without *", pub[1:], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsPublicEgress(tc.allow); got != tc.want {
				t.Errorf("IsPublicEgress(%d entries) = %v, want %v", len(tc.allow), got, tc.want)
			}
		})
	}
}

// TestPublicEgressDocumented: docs/protocol.md shows the default's whole
// list for writers of other clients; it must be the list runnerd sends.
func TestPublicEgressDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "The default's `network` is always this, 39 entries in address order:\n\n```json\n"
	_, rest, ok := strings.Cut(string(b), marker)
	block, _, closed := strings.Cut(rest, "```")
	if !ok || !closed {
		t.Fatalf("docs/protocol.md: no json block after %q", marker)
	}
	var n Network
	if err := json.Unmarshal([]byte(block), &n); err != nil {
		t.Fatalf("docs/protocol.md: the default's network: %v", err)
	}
	if want := PublicEgress(); !slices.Equal(n.Allow, want) {
		t.Errorf("docs/protocol.md shows the default network as %v, want %v", n.Allow, want)
	}
}
