package netpolicy_test

import (
	"net/netip"

	"github.com/miekg/dns"
)

// answerA is the IPv4 addresses of r's A records, in order.
func answerA(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		}
	}
	return out
}
