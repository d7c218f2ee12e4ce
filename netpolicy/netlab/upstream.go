package netlab

import (
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
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

// ServeDNS adds addr to the "net" namespace (AddUpstream) and serves
// handler on its port 53 there: UDP (answers up to 65,535 bytes), and
// TCP too when tcp is true. It returns once every server runs; t's
// cleanup shuts them down and waits for them.
func (l *Lab) ServeDNS(t *testing.T, addr netip.Addr, tcp bool, handler dns.Handler) {
	t.Helper()
	l.AddUpstream(t, addr)
	var pc net.PacketConn
	var ln net.Listener
	if err := InNS(l.Net, func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(addr, 53).String()); err != nil || !tcp {
			return err
		}
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(addr, 53).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	servers := []*dns.Server{{PacketConn: pc, Handler: handler, UDPSize: 65535}}
	if tcp {
		servers = append(servers, &dns.Server{Listener: ln, Handler: handler})
	}
	for _, s := range servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() { defer close(done); s.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { s.Shutdown(); <-done })
	}
}
