package netlab

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
)

// AddUpstream adds addr (a /24) to the "net" namespace's wan0, so a
// server the test starts there (a DNS upstream, say) answers on it.
func (l *Lab) AddUpstream(t *testing.T, addr netip.Addr) {
	t.Helper()
	h, err := netlink.NewHandleAt(l.Net)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName("wan0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
}
