package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// upstreamTimeout bounds one exchange with one upstream server.
const upstreamTimeout = 3 * time.Second

// resolver is one sandbox's allowlist DNS server, listening on UDP and
// TCP port 53 of the sandbox's gateway address in the host namespace. It
// answers only names the current policy admits, forwards those to the
// upstream servers, and admits the answered IPv4 addresses into the
// sandbox's dynamic set before it replies, so a client that got an
// address can connect to it. Everything else is REFUSED.
//
// The policy pointer is swapped atomically by SetPolicy; close stops both
// servers and waits for their goroutines.
type resolver struct {
	m      *Manager
	n      sbNames
	gw     netip.Addr
	policy atomic.Pointer[parsedPolicy]

	servers []*dns.Server
	wg      sync.WaitGroup // the servers' serve goroutines
	once    sync.Once
}

func (m *Manager) startResolver(n sbNames, gw netip.Addr, pp *parsedPolicy) (*resolver, error) {
	r := &resolver{m: m, n: n, gw: gw}
	r.policy.Store(pp)
	var pc net.PacketConn
	var ln net.Listener
	addr := netip.AddrPortFrom(gw, 53).String()
	err := m.inHost(func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", addr); err != nil {
			return err
		}
		if ln, err = net.Listen("tcp4", addr); err != nil {
			pc.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listen resolver on %s: %w", addr, err)
	}
	r.servers = []*dns.Server{
		{PacketConn: pc, Handler: r, UDPSize: dns.DefaultMsgSize},
		{Listener: ln, Handler: r, ReadTimeout: 10 * time.Second, IdleTimeout: func() time.Duration { return 10 * time.Second }},
	}
	for _, s := range r.servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			_ = s.ActivateAndServe() // returns after Shutdown
		}()
		<-started
	}
	return r, nil
}

// close stops the servers and waits for their goroutines. Idempotent.
func (r *resolver) close() {
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range r.servers {
			_ = s.ShutdownContext(ctx)
		}
		r.wg.Wait()
	})
}

// ServeDNS implements dns.Handler.
func (r *resolver) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := r.answer(req, w.LocalAddr().Network() == "udp")
	_ = w.WriteMsg(resp)
}

func (r *resolver) answer(req *dns.Msg, udp bool) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if req.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeNotImplemented
		return resp
	}
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		return resp
	}
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	if q.Qclass != dns.ClassINET || !r.policy.Load().allowsName(name) {
		resp.Rcode = dns.RcodeRefused
		return resp
	}
	switch q.Qtype {
	case dns.TypeAAAA:
		// Sandboxes are IPv4-only: an empty NOERROR makes clients use A
		// at once instead of trying an address they cannot reach.
		return resp
	case dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR:
		resp.Rcode = dns.RcodeRefused
		return resp
	}
	up, err := r.forward(q)
	if err != nil {
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	var addrs []netip.Addr
	ttl := maxAdmitTTL
	for _, rr := range up.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				addrs = append(addrs, ip)
				ttl = min(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
			}
		}
	}
	// Admit before replying: fail closed (SERVFAIL) if the kernel said no,
	// and never hand out an address the sandbox cannot reach yet.
	if err := r.m.admit(r.n, addrs, ttl); err != nil {
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	resp.Rcode = up.Rcode
	for _, rr := range up.Answer {
		if rr.Header().Rrtype != dns.TypeAAAA {
			resp.Answer = append(resp.Answer, rr)
		}
	}
	for _, rr := range up.Ns {
		if rr.Header().Rrtype == dns.TypeSOA {
			resp.Ns = append(resp.Ns, rr) // negative caching
		}
	}
	if udp {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = int(max(o.UDPSize(), dns.MinMsgSize))
		}
		resp.Truncate(size)
	}
	return resp
}

// forward asks the upstream servers in order; the first answer wins. A
// truncated UDP answer is retried over TCP.
func (r *resolver) forward(q dns.Question) (*dns.Msg, error) {
	if len(r.m.upstream) == 0 {
		return nil, errors.New("no upstream DNS servers")
	}
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{q}
	m.SetEdns0(dns.DefaultMsgSize, false)
	var errs []error
	for _, up := range r.m.upstream {
		resp, err := r.exchange(m, up, "udp")
		if err == nil && resp.Truncated {
			resp, err = r.exchange(m, up, "tcp")
		}
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("forward %s: %w", q.Name, errors.Join(errs...))
}

func (r *resolver) exchange(m *dns.Msg, up netip.AddrPort, network string) (*dns.Msg, error) {
	var conn net.Conn
	err := r.m.inHost(func() error {
		var err error
		conn, err = net.DialTimeout(network, up.String(), upstreamTimeout)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", up, err)
	}
	defer conn.Close()
	c := &dns.Client{Net: network, Timeout: upstreamTimeout}
	ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
	defer cancel()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, fmt.Errorf("query upstream %s: %w", up, err)
	}
	if resp.Id != m.Id {
		return nil, fmt.Errorf("query upstream %s: id mismatch", up)
	}
	return resp, nil
}
