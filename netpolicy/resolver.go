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
	"golang.org/x/time/rate"
)

// upstreamTimeout bounds one exchange with one upstream server.
const upstreamTimeout = 3 * time.Second

// Bounds of one sandbox's resolver. A sandbox's command is hostile: a
// flood of queries for names that answer hundreds of addresses, or tens
// of thousands of TCP connections, must cost runnerd a bounded amount of
// work, threads and descriptors, and only that sandbox's DNS may suffer.
// Each excess is counted in Stats.
const (
	// ResolverRate and ResolverBurst bound the queries per second one
	// resolver takes (a token bucket); a UDP query over it is dropped
	// unread by the handlers (the client retries), a TCP connection
	// closed. A build resolving a few hundred names a second stays under.
	ResolverRate  = 200
	ResolverBurst = 400
	// ResolverInflight bounds the queries one resolver serves at once
	// (each may wait on an upstream and on its admission); one more is
	// dropped unanswered.
	ResolverInflight = 16
	// ResolverTCPConns bounds the TCP connections one resolver holds; one
	// more is closed at accept, so a sandbox cannot spend runnerd's
	// descriptors.
	ResolverTCPConns = 16
	// resolverTCPTimeout is how long a TCP connection may wait for a
	// query (its first, then each next one).
	resolverTCPTimeout = 5 * time.Second
)

// resolver is one sandbox's allowlist DNS server, listening on UDP and
// TCP port 53 of the sandbox's gateway address in the host namespace. It
// answers only names the current policy admits and forwards those to the
// upstream servers. For a name an entry names (not only "*"), it admits
// the answered IPv4 addresses the policy's CIDRs do not already hold into
// the sandbox's dynamic set before it replies (through the Manager's
// admission writer), so a client that got an address can connect to it.
// Everything else is REFUSED.
//
// The policy pointer is swapped atomically by SetPolicy; close cancels
// every query in progress, stops both servers and waits for their
// goroutines.
type resolver struct {
	m      *Manager
	n      sbNames
	gw     netip.Addr
	policy atomic.Pointer[parsedPolicy]

	ctx      context.Context // ends at close: queries in progress give up
	cancel   context.CancelFunc
	limiter  *rate.Limiter
	inflight chan struct{} // a slot per query being served
	// admitted is the writer's view of the dynamic set. Guarded by
	// m.dynMu.
	admitted map[netip.Addr]admittedElem

	servers []*dns.Server
	wg      sync.WaitGroup // the servers' serve goroutines
	once    sync.Once
}

func (m *Manager) startResolver(n sbNames, gw netip.Addr, pp *parsedPolicy) (*resolver, error) {
	r := &resolver{m: m, n: n, gw: gw, limiter: rate.NewLimiter(ResolverRate, ResolverBurst),
		inflight: make(chan struct{}, ResolverInflight), admitted: map[netip.Addr]admittedElem{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
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
		r.cancel()
		return nil, fmt.Errorf("listen resolver on %s: %w", addr, err)
	}
	decorate := func(next dns.Reader) dns.Reader { return rateReader{next: next, r: r} }
	r.servers = []*dns.Server{
		{PacketConn: pc, Handler: r, UDPSize: dns.DefaultMsgSize, DecorateReader: decorate},
		{Listener: &limitListener{Listener: ln, r: r, slots: make(chan struct{}, ResolverTCPConns)}, Handler: r,
			DecorateReader: decorate, ReadTimeout: resolverTCPTimeout,
			IdleTimeout: func() time.Duration { return resolverTCPTimeout }},
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

// close cancels the queries in progress (none waits on an upstream or an
// admission any longer), stops the servers and waits for their
// goroutines. Idempotent.
func (r *resolver) close() {
	r.once.Do(func() {
		r.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range r.servers {
			_ = s.ShutdownContext(ctx)
		}
		r.wg.Wait()
	})
}

// rateReader applies the resolver's rate before a query becomes a
// handler goroutine: a UDP packet over the rate is read and dropped in
// the server's read loop, so a flood costs one goroutine's reads, and a
// TCP connection over it is closed.
type rateReader struct {
	next dns.Reader
	r    *resolver
}

func (rr rateReader) ReadTCP(conn net.Conn, timeout time.Duration) ([]byte, error) {
	m, err := rr.next.ReadTCP(conn, timeout)
	if err == nil && !rr.r.limiter.Allow() {
		rr.r.m.stats.rateLimited.Add(1)
		return nil, errors.New("resolver over its rate")
	}
	return m, err
}

func (rr rateReader) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	for {
		m, s, err := rr.next.ReadUDP(conn, timeout)
		if err != nil || rr.r.limiter.Allow() {
			return m, s, err
		}
		rr.r.m.stats.rateLimited.Add(1)
	}
}

// limitListener holds at most cap(slots) connections: one more is closed
// as soon as it is accepted.
type limitListener struct {
	net.Listener
	r     *resolver
	slots chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, slots: l.slots}, nil
		default:
			c.Close()
			l.r.m.stats.tcpRefused.Add(1)
		}
	}
}

// limitConn gives its slot back at its first Close.
type limitConn struct {
	net.Conn
	slots chan struct{}
	once  sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.slots })
	return err
}

// ServeDNS implements dns.Handler.
func (r *resolver) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	select {
	case r.inflight <- struct{}{}:
		defer func() { <-r.inflight }()
	default:
		r.m.stats.busy.Add(1)
		if w.LocalAddr().Network() != "udp" {
			_ = w.Close()
		}
		return
	}
	resp := r.answer(req, w.LocalAddr().Network() == "udp")
	if r.ctx.Err() != nil {
		return // closing: the sandbox is going away
	}
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
	// Admit before replying: fail closed (SERVFAIL) if the kernel said no,
	// and never hand out an address the sandbox cannot reach yet.
	if err := r.admit(name, up); err != nil {
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

// admit puts the A addresses of answer that need it into the sandbox's
// dynamic set, through the writer, and waits for it. None need it when
// the policy admits no answer for name (only "*" allows it), and an
// address needs nothing when the policy's CIDRs already hold it (open
// egress: every address), or when no policy could open it (link-local,
// the pool: the chain rejects those first).
func (r *resolver) admit(name string, answer *dns.Msg) error {
	pp := r.policy.Load()
	if !pp.admitsAnswers(name) {
		return nil
	}
	var addrs []netip.Addr
	ttl := maxAdmitTTL
	for _, rr := range answer.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.A.To4())
		if !ok || pp.covers(ip) || LinkLocal.Contains(ip) || r.m.cfg.Pool.Contains(ip) {
			continue
		}
		addrs = append(addrs, ip)
		ttl = min(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
	}
	if len(addrs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.ctx, admitWait)
	defer cancel()
	return r.m.adm.submit(ctx, &admission{r: r, name: name, addrs: addrs,
		ttl: max(r.m.minAdmitTTL, min(ttl, r.m.maxAdmitTTL)), done: make(chan error, 1)})
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
	ctx, cancel := context.WithTimeout(r.ctx, upstreamTimeout)
	defer cancel()
	var conn net.Conn
	err := r.m.inHost(func() error {
		var err error
		var d net.Dialer
		conn, err = d.DialContext(ctx, network, up.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", up, err)
	}
	defer conn.Close()
	c := &dns.Client{Net: network, Timeout: upstreamTimeout}
	resp, _, err := c.ExchangeWithConnContext(ctx, m, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, fmt.Errorf("query upstream %s: %w", up, err)
	}
	if resp.Id != m.Id {
		return nil, fmt.Errorf("query upstream %s: id mismatch", up)
	}
	return resp, nil
}
