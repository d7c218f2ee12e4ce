package netpolicy

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    []string
		wantErr bool
	}{
		{name: "nil is deny all", in: nil, want: []string{}},
		{name: "empty is deny all", in: []string{}, want: []string{}},
		{name: "hostname normalized", in: []string{"API.Example.COM.", "api.example.com"}, want: []string{"api.example.com"}},
		{name: "wildcard", in: []string{"*.example.com"}, want: []string{"*.example.com"}},
		{name: "ipv4", in: []string{"192.0.2.7"}, want: []string{"192.0.2.7"}},
		{name: "cidr masked", in: []string{"192.0.2.77/24"}, want: []string{"192.0.2.0/24"}},
		{name: "mixed keeps order", in: []string{"b.test", "10.0.0.1", "a.test"}, want: []string{"b.test", "10.0.0.1", "a.test"}},
		{name: "empty entry", in: []string{""}, wantErr: true},
		{name: "ipv6 address", in: []string{"2001:db8::1"}, wantErr: true},
		{name: "ipv6 cidr", in: []string{"2001:db8::/32"}, wantErr: true},
		{name: "bracketed ipv6", in: []string{"[2001:db8::1]"}, wantErr: true},
		{name: "host with port", in: []string{"example.com:443"}, wantErr: true},
		{name: "ip with port", in: []string{"192.0.2.7:80"}, wantErr: true},
		{name: "url", in: []string{"https://example.com"}, wantErr: true},
		{name: "bad cidr", in: []string{"192.0.2.0/33"}, wantErr: true},
		{name: "space inside", in: []string{"exa mple.com"}, wantErr: true},
		{name: "leading hyphen", in: []string{"-bad.com"}, wantErr: true},
		{name: "empty label", in: []string{"a..com"}, wantErr: true},
		{name: "every name", in: []string{" * ", "0.0.0.0/0", "*"}, want: []string{"*", "0.0.0.0/0"}},
		{name: "wildcard of the root", in: []string{"*."}, wantErr: true},
		{name: "inner wildcard", in: []string{"a.*.com"}, wantErr: true},
		{name: "numeric tld is not a name", in: []string{"1.2.3"}, wantErr: true},
		{name: "one bad entry rejects all", in: []string{"ok.test", "bad..test"}, wantErr: true},
		{name: "metadata address", in: []string{"169.254.169.254"}, wantErr: true},
		{name: "metadata /32", in: []string{"169.254.169.254/32"}, wantErr: true},
		{name: "link-local", in: []string{"169.254.0.0/16"}, wantErr: true},
		{name: "inside link-local", in: []string{"169.254.169.0/24"}, wantErr: true},
		{name: "ipv6 link-local", in: []string{"fe80::/10"}, wantErr: true},
		{name: "ipv6 link-local address", in: []string{"fe80::1"}, wantErr: true},
		{name: "covering link-local is fine", in: []string{"169.0.0.0/8"}, want: []string{"169.0.0.0/8"}},
		{name: "private ranges may be named", in: []string{"10.0.0.0/8", "192.168.1.5", "100.64.0.0/10"}, want: []string{"10.0.0.0/8", "192.168.1.5", "100.64.0.0/10"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePolicy(Policy{Allow: tt.in})
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidPolicy) {
					t.Fatalf("ParsePolicy(%q): got %v, %v; want ErrInvalidPolicy", tt.in, got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got.Allow, tt.want) || got.Allow == nil {
				t.Fatalf("ParsePolicy(%q): got %#v, %v; want %q", tt.in, got.Allow, err, tt.want)
			}
		})
	}
}

func TestAllowsName(t *testing.T) {
	pp, err := parsePolicy(Policy{Allow: []string{"a.test", "*.w.test", "10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		q    string
		want bool
	}{
		{"a.test", true},
		{"b.a.test", false},
		{"w.test", false},
		{"x.w.test", true},
		{"y.x.w.test", true},
		{"xw.test", false},
		{"10.0.0.1", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := pp.allowsName(tt.q); got != tt.want {
			t.Errorf("allowsName(%q): got %v, want %v", tt.q, got, tt.want)
		}
	}
	var none *parsedPolicy
	if none.allowsName("a.test") {
		t.Errorf("nil policy admits a name")
	}
	open, err := parsePolicy(OpenEgress())
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"a.test", "example.com", "x.y.z"} {
		if !open.allowsName(q) {
			t.Errorf("OpenEgress: allowsName(%q) false, want true", q)
		}
	}
	// "*" admits no answer (its CIDRs decide): going from it revokes no
	// admitted address, going to it from named entries revokes theirs.
	if !open.namesSubsetOf(pp) || pp.namesSubsetOf(open) {
		t.Errorf("namesSubsetOf: open⊆pp %v, pp⊆open %v; want true, false", open.namesSubsetOf(pp), pp.namesSubsetOf(open))
	}
}

func TestIntervalElements(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	els := intervalElements([]netip.Prefix{p("10.0.1.0/24"), p("10.0.0.0/16"), p("192.0.2.7/32"), p("192.0.2.8/32")})
	type el struct {
		a   string
		end bool
	}
	var got []el
	for _, e := range els {
		got = append(got, el{netip.AddrFrom4([4]byte(e.Key)).String(), e.IntervalEnd})
	}
	want := []el{{"10.0.0.0", false}, {"10.1.0.0", true}, {"192.0.2.7", false}, {"192.0.2.9", true}}
	if !slices.Equal(got, want) {
		t.Fatalf("intervalElements: got %v, want %v", got, want)
	}
	all := intervalElements([]netip.Prefix{p("0.0.0.0/0")})
	if len(all) != 1 || all[0].IntervalEnd {
		t.Fatalf("intervalElements(0.0.0.0/0): got %v, want one open start element", all)
	}
}

func TestCheckID(t *testing.T) {
	for _, id := range []string{"a", "sb-1", "abc-123-def", string(make([]byte, 0)) + "x23456789012345678901234567890123456789012345678901234567890123"} {
		if err := checkID(id); err != nil {
			t.Errorf("checkID(%q): %v", id, err)
		}
	}
	for _, id := range []string{"", "-a", "a-", "A", "a.b", "../x", "a/b", "x234567890123456789012345678901234567890123456789012345678901234"} {
		if err := checkID(id); !errors.Is(err, ErrInvalidID) {
			t.Errorf("checkID(%q): got %v, want ErrInvalidID", id, err)
		}
	}
}

func TestSlotAddrs(t *testing.T) {
	pool := netip.MustParsePrefix("10.213.0.0/16")
	if n := poolSlots(pool); n != 16384 {
		t.Fatalf("poolSlots: got %d, want 16384", n)
	}
	netw, gw, addr := slotAddrs(pool, 65)
	if netw.String() != "10.213.1.4/30" || gw.String() != "10.213.1.5" || addr.String() != "10.213.1.6" {
		t.Fatalf("slotAddrs(65): got %v %v %v", netw, gw, addr)
	}
	if poolSlots(netip.MustParsePrefix("10.0.0.0/31")) != 0 {
		t.Fatalf("a /31 pool has slots")
	}
}

// TestNewRefusesWithoutPrivilege runs New as an unprivileged user (a child
// process of this test binary when we are root) and wants ErrUnsupported:
// the daemon must then not advertise network_policy.
func TestNewRefusesWithoutPrivilege(t *testing.T) {
	if os.Getenv("NETPOLICY_UNPRIV_CHILD") == "1" {
		_, err := New(context.Background(), Config{StateDir: os.Getenv("NETPOLICY_STATE")})
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("New as uid %d: got %v, want ErrUnsupported", os.Geteuid(), err)
		}
		return
	}
	if os.Geteuid() != 0 {
		_, err := New(context.Background(), Config{StateDir: t.TempDir()})
		if !errors.Is(err, ErrUnsupported) {
			t.Fatalf("New as uid %d: got %v, want ErrUnsupported", os.Geteuid(), err)
		}
		return
	}
	// The test binary lives in a root-only build dir: copy it where the
	// unprivileged user can execute it.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "netpolicy-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	child := filepath.Join(dir, "netpolicy.test")
	state := filepath.Join(dir, "state")
	if err := os.WriteFile(child, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(state, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(state, 0o777)
	cmd := exec.Command(child, "-test.run=^TestNewRefusesWithoutPrivilege$", "-test.count=1", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NETPOLICY_UNPRIV_CHILD=1", "NETPOLICY_STATE="+state)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unprivileged child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestNewRefusesWithoutPrivilege") {
		t.Fatalf("unprivileged child did not run the check:\n%s", out)
	}
}

// TestAdmitsAnswers: the resolver admits answers for names an entry or a
// wildcard names, never for a name only "*" allows; an address the
// policy's CIDRs hold needs no admission.
func TestAdmitsAnswers(t *testing.T) {
	pp, err := parsePolicy(Policy{Allow: []string{"*", "a.test", "*.w.test", "192.0.2.0/24", "198.51.100.7"}})
	if err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]bool{"a.test": true, "x.w.test": true, "other.test": false, "w.test": false} {
		if got := pp.admitsAnswers(q); got != want {
			t.Errorf("admitsAnswers(%q) = %v, want %v", q, got, want)
		}
		if !pp.allowsName(q) {
			t.Errorf("allowsName(%q) = false under \"*\"", q)
		}
	}
	for a, want := range map[string]bool{"192.0.2.0": true, "192.0.2.255": true, "192.0.3.0": false, "198.51.100.7": true,
		"198.51.100.8": false, "0.0.0.0": false, "255.255.255.255": false} {
		if got := pp.covers(netip.MustParseAddr(a)); got != want {
			t.Errorf("covers(%s) = %v, want %v", a, got, want)
		}
	}
	open, _ := parsePolicy(OpenEgress())
	for _, a := range []string{"0.0.0.0", "10.1.2.3", "169.254.169.254", "255.255.255.255"} {
		if !open.covers(netip.MustParseAddr(a)) {
			t.Errorf("OpenEgress does not cover %s", a)
		}
	}
}

// TestPublicEgress: the policy holds every IPv4 address but the private
// ranges, and is a valid policy as it stands.
func TestPublicEgress(t *testing.T) {
	p := PublicEgress()
	norm, err := ParsePolicy(p)
	if err != nil || !slices.Equal(norm.Allow, p.Allow) || p.Allow[0] != "*" {
		t.Fatalf("ParsePolicy(PublicEgress()) = %v, %v; want it unchanged, starting with *", norm.Allow, err)
	}
	pp, _ := parsePolicy(p)
	for a, want := range map[string]bool{
		"1.1.1.1": true, "9.255.255.255": true, "11.0.0.0": true, "100.63.255.255": true, "100.128.0.0": true,
		"172.15.255.255": true, "172.32.0.0": true, "192.167.255.255": true, "192.169.0.0": true, "203.0.113.9": true,
		"169.253.255.255": true, "169.255.0.0": true, "255.255.255.255": true,
		"10.0.0.0": false, "10.255.255.255": false, "100.64.0.1": false, "100.127.255.255": false, "172.16.0.1": false,
		"172.31.255.255": false, "192.168.0.1": false,
		"169.254.169.254": true, // covered, and rejected by the chain before the sets are read
	} {
		if got := pp.covers(netip.MustParseAddr(a)); got != want {
			t.Errorf("PublicEgress covers %s = %v, want %v", a, got, want)
		}
	}
	t.Logf("PublicEgress: %d entries: %v", len(p.Allow), p.Allow)
}

func TestRangesWithin(t *testing.T) {
	pol := func(allow ...string) *parsedPolicy {
		t.Helper()
		pp, err := parsePolicy(Policy{Allow: allow})
		if err != nil {
			t.Fatal(err)
		}
		return pp
	}
	for _, tc := range []struct {
		from, to []string
		want     bool
	}{
		{nil, []string{"192.0.2.1"}, true},
		{[]string{"192.0.2.1"}, []string{"192.0.2.0/24"}, true},
		{[]string{"192.0.2.0/24"}, []string{"192.0.2.1"}, false},
		{[]string{"192.0.2.0/25"}, []string{"192.0.2.0/26", "192.0.2.64/26"}, true}, // merged
		{[]string{"192.0.2.0/24"}, []string{"192.0.2.0/25", "198.51.100.0/24"}, false},
		{[]string{"192.0.2.7", "10.0.0.0/8"}, []string{"10.0.0.0/7", "192.0.2.0/28"}, true},
		{[]string{"10.0.0.0/8"}, nil, false},
		{[]string{"a.test"}, nil, true}, // names are not ranges: flushDyn judges them
	} {
		if got := pol(tc.from...).rangesWithin(pol(tc.to...)); got != tc.want {
			t.Errorf("%v within %v: got %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}
