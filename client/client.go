package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/wire"
)

// Default deadlines. Every call has a connect deadline and a request
// deadline; see [Options].
const (
	DefaultConnectTimeout   = 5 * time.Second
	DefaultRequestTimeout   = 30 * time.Second
	DefaultHeartbeatTimeout = 30 * time.Second
)

// Options tune a [Client]. The zero value is usable.
type Options struct {
	// ConnectTimeout bounds dialing the daemon (TCP connect or unix socket
	// connect). Default DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// RequestTimeout bounds every request that is not a stream, from the
	// first byte sent to the last byte of the response body. Calls whose
	// answer legitimately waits (terminate, suspend, delete) get their
	// wait added to it; Exec gets its TimeoutMS added, and without one it
	// is bounded by the caller's context and by [Options.ExecLiveness].
	// Default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// HeartbeatTimeout is how long an attach may be silent before it is
	// declared dead (runnerd sends a heartbeat after 15 s of silence).
	// Default DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// ExecLiveness is how often a long Exec checks that the daemon still
	// answers GET /healthz; two failed checks in a row abandon the exec
	// with *adapter.UnavailableError (the command keeps running; its
	// session stays readable). Default 15 s.
	ExecLiveness time.Duration
	// UserAgent is sent with every request. Default "runner-client".
	UserAgent string
	// RootCAs verify an https runnerd's certificate (runnerd --tls-cert);
	// nil means the host's roots. Certificate, when set, is presented to a
	// runnerd that requires client certificates (--tls-client-ca; the
	// bearer token is still sent and required). [TLSFiles.Apply] loads
	// both from PEM files. A certificate refused either way is
	// *adapter.DeniedError, never unavailable or not_found.
	RootCAs     *x509.CertPool
	Certificate *tls.Certificate
	// ServerName, when set, is the name runnerd's certificate is verified
	// against instead of the endpoint's host: a fleet whose runnerds share
	// one certificate (deploy/k8s: runnerd.runner-system) is dialled by
	// node address.
	ServerName string
}

func (o Options) withDefaults() Options {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.HeartbeatTimeout <= 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.ExecLiveness <= 0 {
		o.ExecLiveness = 15 * time.Second
	}
	if o.UserAgent == "" {
		o.UserAgent = "runner-client"
	}
	return o
}

// Client speaks docs/protocol.md to one runnerd. It is safe for concurrent
// use. Close releases its idle connections; it starts no goroutine of its
// own (a [FrameReader] or a [StreamBody] it returns must be closed by the
// caller).
//
// The bearer token is held in an unexported field that no formatting verb
// prints: %v, %+v and %#v of a Client show the endpoint and "[token]".
type Client struct {
	endpoint string       // as given, for String
	base     *url.URL     // http://host:port or http://unix for a socket
	token    secret       // never printed
	hc       *http.Client // no Timeout: deadlines come from contexts
	tr       *http.Transport
	opts     Options
}

// secret is a string that formats as "[token]" under every verb.
type secret string

func (secret) String() string                { return "[token]" }
func (secret) GoString() string              { return "[token]" }
func (secret) Format(f fmt.State, verb rune) { _, _ = io.WriteString(f, "[token]") }
func (secret) MarshalText() ([]byte, error)  { return []byte("[token]"), nil }
func (s secret) bearer() string              { return "Bearer " + string(s) }

// New returns a Client for the daemon at endpoint: "http://127.0.0.1:7323"
// (TCP), "https://host:7323" (runnerd --tls-cert, or a TLS proxy; see
// Options.RootCAs) or "unix:///path/to/runnerd.sock". token is the bearer token (see [Discover]).
func New(endpoint, token string, opts Options) (*Client, error) {
	opts = opts.withDefaults()
	dialer := &net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 15 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil, // loopback daemons; never route the token through an env proxy
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       60 * time.Second,
		TLSHandshakeTimeout:   opts.ConnectTimeout,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     false,
		TLSClientConfig:       opts.tlsConfig(),
	}
	c := &Client{endpoint: endpoint, token: secret(token), tr: tr, opts: opts}
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		path := strings.TrimPrefix(endpoint, "unix://")
		if path == "" {
			return nil, fmt.Errorf("client: endpoint %q names no socket path", endpoint)
		}
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		}
		c.base = &url.URL{Scheme: "http", Host: "unix"}
	case strings.HasPrefix(endpoint, "http://"), strings.HasPrefix(endpoint, "https://"):
		u, err := url.Parse(endpoint)
		if err != nil {
			return nil, fmt.Errorf("client: parse endpoint: %w", err)
		}
		if u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return nil, fmt.Errorf("client: endpoint %q: want scheme://host:port and nothing else", endpoint)
		}
		tr.DialContext = dialer.DialContext
		c.base = &url.URL{Scheme: u.Scheme, Host: u.Host}
	default:
		return nil, fmt.Errorf("client: endpoint %q: want http://host:port or unix:///path", endpoint)
	}
	c.hc = &http.Client{
		Transport: tr,
		// A redirect would replay the Authorization header elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c, nil
}

// Endpoint returns the endpoint the Client was made with.
func (c *Client) Endpoint() string { return c.endpoint }

// String returns "runner client <endpoint>".
func (c *Client) String() string { return "runner client " + c.endpoint }

// GoString is String, so %#v never prints the token.
func (c *Client) GoString() string { return c.String() }

// Format prints String under every verb, so %v, %+v and %#v never print
// the token.
func (c *Client) Format(f fmt.State, verb rune) { _, _ = io.WriteString(f, c.String()) }

// Close releases idle connections. Streams already returned stay open
// until their own Close. Close is idempotent.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// apiPath joins the versioned API path from escaped segments.
func apiPath(segs ...string) string {
	var b strings.Builder
	b.WriteString(wire.APIVersion)
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

type incarnationKey struct{}

// WithIncarnation returns a context under which every call to a
// /v1/sandboxes/{name}/... endpoint names incarnation inc (the query
// parameter wire.QueryIncarnation): runnerd then answers not_found when
// the live sandbox of that name is another incarnation (or none), and a
// DeleteSandbox is a no-op success, so a call made with a stale handle
// never acts on a newer sandbox of the same name. "" names none. The
// Adapter uses it for every handle-scoped call.
func WithIncarnation(ctx context.Context, inc string) context.Context {
	return context.WithValue(ctx, incarnationKey{}, inc)
}

// scopedQuery adds ctx's incarnation (WithIncarnation) to q for a
// sandbox-scoped path.
func scopedQuery(ctx context.Context, path string, q url.Values) url.Values {
	inc, _ := ctx.Value(incarnationKey{}).(string)
	if inc == "" || !strings.HasPrefix(path, wire.APIVersion+"/sandboxes/") {
		return q
	}
	out := url.Values{}
	for k, v := range q {
		out[k] = v
	}
	out.Set(wire.QueryIncarnation, inc)
	return out
}

func (c *Client) url(path string, q url.Values) string {
	u := *c.base
	u.Path = path
	if len(q) > 0 {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// call describes one request.
type call struct {
	method string
	path   string
	query  url.Values
	body   any    // JSON-encoded when not nil
	raw    []byte // sent as is when not nil (stdin)
	extra  time.Duration
	noAuth bool
	// unbounded drops the request deadline (the caller's context and
	// doLive's liveness check bound the call instead).
	unbounded bool
	// status, when not nil, receives the 2xx status.
	status *int
	// header is sent with the request; respHeader, when not nil,
	// receives the 2xx answer's header.
	header     http.Header
	respHeader *http.Header
}

// do performs a non-streaming call under the request deadline and decodes
// a 2xx JSON answer into out (nil: the body is drained and ignored). Every
// failure is classified into the adapter taxonomy (see doc.go).
func (c *Client) do(ctx context.Context, cl call, out any) error {
	op := cl.method + " " + cl.path
	rctx, cancel := context.WithCancel(ctx)
	if !cl.unbounded {
		rctx, cancel = context.WithTimeout(ctx, c.opts.RequestTimeout+cl.extra)
	}
	defer cancel()
	var body io.Reader
	ctype := ""
	switch {
	case cl.raw != nil:
		body = bytes.NewReader(cl.raw)
		ctype = "application/octet-stream"
	case cl.body != nil:
		b, err := json.Marshal(cl.body)
		if err != nil {
			return invalidf("%s: encode request: %v", op, err)
		}
		body = bytes.NewReader(b)
		ctype = "application/json"
	}
	req, err := http.NewRequestWithContext(rctx, cl.method, c.url(cl.path, scopedQuery(ctx, cl.path, cl.query)), body)
	if err != nil {
		return invalidf("%s: %v", op, err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	c.header(req.Header, cl.noAuth)
	for k, v := range cl.header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportErr(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return responseErr(ctx, op, resp)
	}
	if cl.status != nil {
		*cl.status = resp.StatusCode
	}
	if cl.respHeader != nil {
		*cl.respHeader = resp.Header
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return transportErr(ctx, op, fmt.Errorf("read response body: %w", err))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		// A body cut by the network, or something that is not runnerd:
		// never an empty answer.
		return unavailablef("%s: decode response body (%d bytes): %v", op, len(b), err)
	}
	return nil
}

// maxResponse bounds a JSON answer: an exec answer carries two streams of
// up to 16 MiB each, base64-encoded.
const maxResponse = 3 * wire.MaxExecOutput

func (c *Client) header(h http.Header, noAuth bool) {
	if !noAuth {
		h.Set("Authorization", c.token.bearer())
	}
	h.Set("User-Agent", c.opts.UserAgent)
	h.Set("Accept", "application/json")
}

// errBodyLimit bounds how much of an error body is read.
const errBodyLimit = 64 << 10

// decodeErrorBody reads resp's error body (bounded). It is shared by plain
// requests and the WebSocket handshake.
func decodeErrorBody(resp *http.Response) (*wire.Error, bool) {
	if resp.Body == nil {
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, errBodyLimit))
	if err != nil {
		return nil, false
	}
	var eb wire.ErrorBody
	if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
		return nil, false
	}
	return &eb.Error, true
}

// errDaemonGone is the cancel cause doLive's watcher sets.
var errDaemonGone = errors.New("daemon stopped answering health checks")

// doLive is do for a call whose answer may take arbitrarily long (exec):
// a watcher goroutine, owned and waited for here, checks GET /healthz every
// ExecLiveness and abandons the call after two failed checks in a row, so a
// daemon that hangs (stopped, wedged host) is detected instead of waited
// on forever.
func (c *Client) doLive(ctx context.Context, cl call, out any) error {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.opts.ExecLiveness)
		defer t.Stop()
		failed := 0
		for {
			select {
			case <-done:
				return
			case <-lctx.Done():
				return
			case <-t.C:
			}
			hctx, hcancel := context.WithTimeout(lctx, min(c.opts.ExecLiveness, 10*time.Second))
			_, err := c.Health(hctx)
			hcancel()
			if err == nil {
				failed = 0
				continue
			}
			if failed++; failed >= 2 {
				cancel(errDaemonGone)
				return
			}
		}
	})
	err := c.do(lctx, cl, out)
	close(done)
	wg.Wait()
	if ctx.Err() == nil && errors.Is(context.Cause(lctx), errDaemonGone) {
		return unavailablef("%s %s: %v", cl.method, cl.path, errDaemonGone)
	}
	return err
}
