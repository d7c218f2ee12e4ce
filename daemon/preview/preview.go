package preview

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrUnknownToken is returned by Config.Lookup when a token maps to no
// sandbox port: it was never issued, or it was revoked, or its sandbox was
// destroyed. The Server answers it with a 404. Any other Lookup error is
// treated as transient and answered with a 503.
var ErrUnknownToken = errors.New("unknown preview token")

// Target is where a token leads: one port of one sandbox.
type Target struct {
	// Sandbox is the sandbox's name. It appears in logs and error pages.
	Sandbox string
	// Addr is the sandbox's own address and the port: 127.0.0.1:PORT for a
	// sandbox on the host's network, or the sandbox's veth address and
	// PORT. The Server reaches the port on loopback first (see Addrs), so
	// a server bound to 127.0.0.1 or ::1 is served as well as one bound to
	// Addr or a wildcard.
	Addr netip.AddrPort
	// NetNS is the path of the sandbox's network namespace (a bind-mounted
	// nsfs file), or empty for a sandbox on the host's network. With it
	// the Server makes its sockets inside that namespace, so "loopback"
	// is the sandbox's own: nothing is routed between the namespace and
	// the host for it.
	NetNS string
}

// Addrs are the addresses the Server tries for t, in order, inside t's
// network namespace: 127.0.0.1, ::1, then t.Addr when it is not loopback,
// all on t's port. A server bound to any of them, or to a wildcard, is
// reached. The first that does not refuse the connection is used.
func (t Target) Addrs() []netip.AddrPort {
	port := t.Addr.Port()
	addrs := []netip.AddrPort{
		netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port),
		netip.AddrPortFrom(netip.IPv6Loopback(), port),
	}
	if a := t.Addr.Addr().Unmap(); a.IsValid() && !a.IsLoopback() {
		addrs = append(addrs, netip.AddrPortFrom(a, port))
	}
	return addrs
}

// Config configures a Server.
type Config struct {
	// URLTemplate is how URLs are formed: an http or https URL whose host's
	// first label is exactly "{token}", followed by at least one domain
	// label, with an optional port and no path. For example
	// "http://{token}.localhost:7324/" on a workstation, or
	// "https://{token}.preview.example.com/" behind wildcard DNS and a TLS
	// terminator. New rejects anything else.
	URLTemplate string

	// Lookup maps a token to its Target; it is the daemon's registry. It
	// returns ErrUnknownToken (possibly wrapped) when the token maps to
	// nothing, and any other error when it cannot tell. It is called
	// concurrently, only with well-formed tokens, and must return promptly
	// once ctx is done. Its errors are logged, so they must not contain the
	// token.
	Lookup func(ctx context.Context, token string) (Target, error)

	// Logger receives the Server's logs. Nil discards them. Tokens are never
	// logged beyond a four-character prefix.
	Logger *slog.Logger
}

// Limits on the listener. Bodies and upgraded connections carry no deadline:
// a preview may stream, long-poll or hold a WebSocket for hours.
const (
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	dialTimeout       = 10 * time.Second
)

// Server is the preview listener. It is safe for concurrent use. Whoever
// calls New must call Close.
type Server struct {
	tmpl   urlTemplate
	lookup func(context.Context, string) (Target, error)
	log    *slog.Logger

	srv       *http.Server
	proxy     *httputil.ReverseProxy
	transport *http.Transport

	// baseCtx is the parent of every request's context; Close cancels it,
	// which also ends hijacked (WebSocket) connections that http.Server.Close
	// does not know about.
	baseCtx context.Context
	cancel  context.CancelFunc

	mu     sync.Mutex // guards closed, and orders wg.Add before Close's wg.Wait
	closed bool
	wg     sync.WaitGroup // running Serve calls and request handlers

	closeOnce sync.Once
	closeErr  error
}

// routeKey is the context key under which a request carries its route from
// the handler to the proxy's Rewrite.
type routeKey struct{}

type route struct {
	token  string
	target Target
}

// New validates cfg and returns a Server that is not yet serving; call Serve.
func New(cfg Config) (*Server, error) {
	tmpl, err := parseTemplate(cfg.URLTemplate)
	if err != nil {
		return nil, err
	}
	if cfg.Lookup == nil {
		return nil, errors.New("preview config: Lookup is nil")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{tmpl: tmpl, lookup: cfg.Lookup, log: logger}
	s.baseCtx, s.cancel = context.WithCancel(context.Background())
	s.transport = &http.Transport{
		Proxy:                 nil,       // only ever the Target; never an environment proxy
		DialContext:           dialRoute, // the request's Target, never the URL's host
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass the app's bytes through as they are
	}
	errorLog := slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	s.proxy = &httputil.ReverseProxy{
		Rewrite:        s.rewrite,
		Transport:      s.transport,
		FlushInterval:  -1, // flush every write: streams and server-sent events arrive as sent
		ModifyResponse: modifyResponse,
		ErrorHandler:   s.proxyError,
		ErrorLog:       errorLog,
	}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.handle),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ErrorLog:          errorLog,
	}
	return s, nil
}

// URL returns the preview URL for token, as a browser should open it. The
// token should come from NewToken.
func (s *Server) URL(token string) string {
	return s.tmpl.prefix + token + s.tmpl.suffix
}

// Serve accepts connections on l and serves previews until Close. It closes
// l when it returns. It may be called for several listeners. After Close it
// returns http.ErrServerClosed; any other error is from l.Accept.
func (s *Server) Serve(l net.Listener) error {
	if !s.enter() {
		l.Close()
		return http.ErrServerClosed
	}
	defer s.wg.Done()
	return s.srv.Serve(l)
}

// Close stops serving: it closes the listeners and every connection,
// WebSockets included, and returns once every Serve call and request handler
// has returned. It is idempotent; every call returns the first call's result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel()
		s.closeErr = s.srv.Close()
		s.wg.Wait()
		s.transport.CloseIdleConnections()
	})
	return s.closeErr
}

// enter registers one unit of work with wg, or reports false once Close has
// begun.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// handle routes one request: Host → token → Target → proxy.
func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		writePage(w, http.StatusServiceUnavailable, pageClosing, nil)
		return
	}
	defer s.wg.Done()

	// A request that already went through a preview proxy (this one or
	// another runnerd's) is refused: a sandbox port that forwards to a
	// preview URL, or a URL minted for the preview listener itself, would
	// otherwise recurse until the process runs out of descriptors.
	if r.Header.Get(HopHeader) != "" {
		s.log.Warn("preview: refused a request that already passed a preview proxy", "host", r.Host)
		writePage(w, http.StatusLoopDetected, pageLoop, nil)
		return
	}
	token := s.tmpl.tokenFromHost(r.Host)
	if token == "" {
		writePage(w, http.StatusNotFound, pageNotFound, nil)
		return
	}
	target, err := s.lookup(r.Context(), token)
	switch {
	case errors.Is(err, ErrUnknownToken):
		s.log.Debug("preview: unknown token", "token", tokenPrefix(token))
		writePage(w, http.StatusNotFound, pageNotFound, nil)
		return
	case err != nil:
		// Never a 404: a registry that cannot answer must not read as "gone".
		s.log.Warn("preview: look up token", "token", tokenPrefix(token), "err", err)
		writePage(w, http.StatusServiceUnavailable, pageUnavailable, nil)
		return
	case !target.Addr.IsValid() || target.Addr.Port() == 0:
		s.log.Error("preview: lookup returned an invalid address", "token", tokenPrefix(token), "sandbox", target.Sandbox, "addr", target.Addr)
		writePage(w, http.StatusBadGateway, pageBadGateway, &target)
		return
	}
	ctx := context.WithValue(r.Context(), routeKey{}, route{token: token, target: target})
	s.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// rewrite points the outbound request at the route's Target. The Host header
// stays what the browser sent, so the app sees its public origin; the
// X-Forwarded headers say who asked and over which scheme the URL is served.
func (s *Server) rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(route)
	// The URL's host only keys the Transport's pool of idle connections
	// (dialRoute dials the Target itself): one key per sandbox namespace
	// and port, so a connection into one sandbox is never reused for
	// another's request, although every sandbox has its own 127.0.0.1.
	pr.SetURL(&url.URL{Scheme: "http", Host: poolKey(rt.target)})
	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
	pr.Out.Header.Set("X-Forwarded-Proto", s.tmpl.scheme)
	pr.Out.Header.Set(HopHeader, "1")
}

// HopHeader marks a request the preview proxy forwarded. The proxy refuses
// a request that carries it (508 Loop Detected), so no chain of previews
// can bring a request back to a preview listener.
const HopHeader = "Runner-Preview-Hop"

// proxyError answers a request whose Target could not be reached or answered
// badly.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	rt, _ := r.Context().Value(routeKey{}).(route)
	if r.Context().Err() != nil {
		// The browser left or the Server is closing; nobody reads a page.
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		s.log.Info("preview: sandbox port not serving", "sandbox", rt.target.Sandbox, "port", rt.target.Addr.Port(), "token", tokenPrefix(rt.token))
		writePage(w, http.StatusBadGateway, pageNotServing, &rt.target)
		return
	}
	s.log.Warn("preview: proxy to sandbox port", "sandbox", rt.target.Sandbox, "port", rt.target.Addr.Port(), "token", tokenPrefix(rt.token), "err", err)
	writePage(w, http.StatusBadGateway, pageBadGateway, &rt.target)
}

// modifyResponse confines what the app can do to other previews and to its
// own token, without otherwise changing its response:
//   - a Set-Cookie Domain attribute is removed, so a cookie is host-only and
//     one preview cannot set cookies that other previews (sibling hosts under
//     the same suffix) receive;
//   - with no Referrer-Policy of the app's own, "same-origin" keeps the token
//     in the host from leaking to third-party sites through Referer.
func modifyResponse(res *http.Response) error {
	if cookies := res.Header.Values("Set-Cookie"); len(cookies) > 0 {
		res.Header.Del("Set-Cookie")
		for _, c := range cookies {
			res.Header.Add("Set-Cookie", stripCookieDomain(c))
		}
	}
	if res.Header.Get("Referrer-Policy") == "" {
		res.Header.Set("Referrer-Policy", "same-origin")
	}
	return nil
}

// stripCookieDomain returns a Set-Cookie value without its Domain attributes.
func stripCookieDomain(v string) string {
	parts := strings.Split(v, ";")
	kept := make([]string, 1, len(parts))
	kept[0] = parts[0] // name=value
	for _, p := range parts[1:] {
		name, _, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(name), "domain") {
			continue
		}
		kept = append(kept, p)
	}
	return strings.Join(kept, ";")
}
