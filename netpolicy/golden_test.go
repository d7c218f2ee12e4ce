package netpolicy

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
)

var update = flag.Bool("update", false, "rewrite the golden netlink files in testdata/")

// recorder is an nftables connection that never reaches a kernel: it
// keeps every netlink message of every batch and acknowledges each one,
// so the rule builder runs without root. (google/nftables' own tests do
// the same with its internal nftest.Recorder.)
type recorder struct {
	msgs []netlink.Message
}

func (r *recorder) dial() (*nftables.Conn, error) {
	return nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		r.msgs = append(r.msgs, req...)
		acks := make([]netlink.Message, 0, len(req))
		for _, m := range req {
			if m.Header.Flags&netlink.Acknowledge != 0 {
				acks = append(acks, netlink.Message{
					Header: netlink.Header{Length: 4, Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID},
					Data:   []byte{0, 0, 0, 0},
				})
			}
		}
		return acks, nil
	}))
}

// dump renders the recorded messages one per line: type, flags and the
// payload in hex. Length, sequence and port id are left out: they are
// not the builder's choice.
func (r *recorder) dump() string {
	var b strings.Builder
	for _, m := range r.msgs {
		fmt.Fprintf(&b, "type=%#04x flags=%#04x %x\n", uint16(m.Header.Type), uint16(m.Header.Flags), m.Data)
	}
	return b.String()
}

// TestGoldenNetlink checks, without root, the exact netlink messages the
// rule builder sends for each operation against testdata/*.golden. Run
// with -update after an intended change and review the diff (an
// `nft --debug=netlink` of the new ruleset helps to read it).
func TestGoldenNetlink(t *testing.T) {
	n := (&Manager{cfg: Config{Table: DefaultTable}}).namesFor("golden")
	_, gw, addr := slotAddrs(DefaultPool, 0)
	prefixes := []netip.Prefix{netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("10.0.0.0/8")}
	for _, tc := range []struct {
		name string
		op   func(m *Manager) error
	}{
		{"new", func(m *Manager) error { return m.ensureTable() }},
		{"setup", func(m *Manager) error {
			return m.setupRules(context.Background(), n, addr, gw, nil)
		}},
		{"set-policy", func(m *Manager) error { return m.setStatic(context.Background(), n, prefixes, true) }},
		{"set-policy-keep-dns", func(m *Manager) error { return m.setStatic(context.Background(), n, prefixes, false) }},
		{"deny-all", func(m *Manager) error { return m.denyAll(context.Background(), n) }},
		{"admit", func(m *Manager) error {
			// One transaction of adds: "add" of a present element
			// restarts its timeout, so no delete goes first.
			return m.writeDyn([]dynWrite{{n: n, elems: []nftables.SetElement{
				{Key: netip.MustParseAddr("198.51.100.1").AsSlice(), Timeout: time.Hour},
				{Key: netip.MustParseAddr("198.51.100.2").AsSlice(), Timeout: time.Hour}}}})
		}},
		{"teardown", func(m *Manager) error { return m.removeSandboxRules(context.Background(), n, []netip.Addr{gw}) }},
		{"teardown-partial", func(m *Manager) error { return m.deleteSandboxObjects(context.Background(), n, []netip.Addr{gw}, true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			m := &Manager{cfg: Config{Table: DefaultTable, Pool: DefaultPool}, dialNFT: rec.dial,
				minAdmitTTL: minAdmitTTL, maxAdmitTTL: maxAdmitTTL}
			if err := tc.op(m); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got := rec.dump()
			path := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden file (run with -update to create it): %v", err)
			}
			if !bytes.Equal([]byte(got), want) {
				t.Fatalf("netlink messages of %s differ from %s (rerun with -update if intended):\n%s", tc.name, path, lineDiff(got, string(want)))
			}
		})
	}
}

// lineDiff names the first differing line of got and want.
func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("message %d:\n got %s\nwant %s\n(got %d messages, want %d)", i, gl, wl, len(g)-1, len(w)-1)
		}
	}
	return ""
}
