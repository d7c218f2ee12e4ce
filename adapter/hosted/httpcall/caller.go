package httpcall

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/secret"
)

// DefaultMaxBody bounds every answer read into memory when neither the
// Caller nor the Request names a bound.
const DefaultMaxBody = 64 << 20

// Caller sends one provider's HTTP requests and maps every outcome into
// the taxonomy: it builds the request, sets the credential, reads the
// whole answer before judging it (a connection dropped mid-body is a
// transport failure, not an answer), hands a failed answer to the
// provider's Fail, decodes JSON, and keeps the provider's secrets and the
// request URL out of every error. It is safe for concurrent use once
// configured and holds no goroutines.
type Caller struct {
	// Provider names the provider in every *Error.
	Provider string
	// Base is put in front of a Request.URL that is a path.
	Base string
	// Client sends every request; make it with [NewClient] so that it
	// never follows a redirect.
	Client *http.Client
	// Header sets the credential and the provider's fixed headers on
	// every request (before Request.Header, which may override them).
	Header func(http.Header)
	// Secrets are removed from every error text.
	Secrets []secret.Secret
	// Fail maps an answer whose status is not one of Request.OK. raw is
	// the answer's body (bounded).
	Fail func(r *Request, status int, h http.Header, raw []byte, red Redactor) error
	// MaxBody bounds every answer read into memory; 0: DefaultMaxBody.
	MaxBody int64
	// Accept is every request's Accept header (empty: none).
	Accept string
}

// Request is one call.
type Request struct {
	// Op is the call as a short verb phrase ("get sandbox x").
	Op string
	// Class is the call's class in the provider's error table.
	Class Op
	// Method is the HTTP method.
	Method string
	// URL is absolute (http:// or https://) or a path under Caller.Base.
	URL string
	// Query, when not empty, is the URL's query.
	Query url.Values
	// JSON, when not nil, is encoded as the body (application/json).
	JSON any
	// Body, when JSON is nil, is the body as is, of ContentType.
	Body        io.Reader
	ContentType string
	// Accept, when set, is the Accept header instead of the Caller's.
	Accept string
	// Header holds the call's own headers.
	Header http.Header
	// OK are the statuses that are success; empty: any 2xx.
	OK []int
	// Uncertain says a transport failure may have taken effect (a
	// non-idempotent call): the *adapter.UnavailableError says so.
	Uncertain bool
	// Redact are strings removed verbatim from every error text, beside
	// the request URL (an exec's argv and environment).
	Redact []string
	// MaxBody bounds the answer read by Do; 0: the Caller's.
	MaxBody int64
	// Fail, when set, maps this call's failed answers instead of the
	// Caller's Fail (a call with answers of its own, such as a kill's 410).
	Fail func(status int, h http.Header, raw []byte, red Redactor) error
}

// Reply is a successful answer read whole.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// NewClient returns a copy of hc (nil: a client with no overall timeout,
// bounded by each call's context) that never follows a redirect: Go
// re-sends custom headers such as X-API-Key to wherever a redirect points
// (it strips only Authorization and cookies across hosts), and a host may
// come from an API answer. A 3xx is an answer here.
func NewClient(hc *http.Client) *http.Client {
	c := http.Client{}
	if hc != nil {
		c = *hc
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

// CheckURL returns *adapter.InvalidError unless u is an http or https URL
// with a host and without user info.
func CheckURL(u string) error {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.User != nil {
		return &adapter.InvalidError{Detail: "bad URL " + strconv.Quote(u)}
	}
	return nil
}

func (c *Caller) fail(op string, status int, kind error) error {
	return NewError(c.Provider, op, status, kind)
}

// Open sends r and returns the answer with its body unread when its
// status is one of r.OK; the caller reads (a stream) and closes it. Every
// other outcome is an error in the taxonomy. red is the call's redactor,
// for errors the caller makes while reading.
func (c *Caller) Open(ctx context.Context, r *Request) (resp *http.Response, red Redactor, err error) {
	u := r.URL
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		u = c.Base + u
	}
	red = Redactor{Secrets: c.Secrets, Plain: append([]string{u}, r.Redact...)}
	if len(r.Query) > 0 {
		q := r.Query.Encode()
		u += "?" + q
		red.Plain = append(red.Plain, u, r.URL+"?"+q, q)
	}
	body, ct := r.Body, r.ContentType
	if r.JSON != nil {
		b, err := json.Marshal(r.JSON)
		if err != nil {
			return nil, red, c.fail(r.Op, 0, &adapter.InvalidError{Detail: "encode request: " + err.Error()})
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, u, body)
	if err != nil {
		return nil, red, c.fail(r.Op, 0, &adapter.InvalidError{Detail: "build request: " + red.Clean(URLFree(err))})
	}
	if c.Header != nil {
		c.Header(req.Header)
	}
	if accept := cmp.Or(r.Accept, c.Accept); accept != "" {
		req.Header.Set("Accept", accept)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	resp, err = c.Client.Do(req)
	if err != nil {
		return nil, red, TransportError(ctx, c.Provider, r.Op, err, r.Uncertain, red)
	}
	if ok(r.OK, resp.StatusCode) {
		return resp, red, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.limit(r)))
	if err != nil {
		return nil, red, TransportError(ctx, c.Provider, r.Op, fmt.Errorf("read body: %w", err), r.Uncertain, red)
	}
	if r.Fail != nil {
		return nil, red, r.Fail(resp.StatusCode, resp.Header, raw, red)
	}
	return nil, red, c.Fail(r, resp.StatusCode, resp.Header, raw, red)
}

func ok(statuses []int, status int) bool {
	if len(statuses) == 0 {
		return status >= 200 && status <= 299
	}
	return slices.Contains(statuses, status)
}

func (c *Caller) limit(r *Request) int64 {
	switch {
	case r.MaxBody > 0:
		return r.MaxBody
	case c.MaxBody > 0:
		return c.MaxBody
	}
	return DefaultMaxBody
}

// Do sends r and returns its successful answer read whole.
func (c *Caller) Do(ctx context.Context, r *Request) (Reply, error) {
	resp, red, err := c.Open(ctx, r)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, c.limit(r)))
	if err != nil {
		return Reply{}, TransportError(ctx, c.Provider, r.Op, fmt.Errorf("read body: %w", err), r.Uncertain, red)
	}
	return Reply{Status: resp.StatusCode, Header: resp.Header, Body: raw}, nil
}

// JSON sends r and decodes its successful answer into out (nil: the
// answer is not read as JSON). A success whose body does not parse was cut
// or mangled on the way: *adapter.UnavailableError.
func (c *Caller) JSON(ctx context.Context, r *Request, out any) (Reply, error) {
	rep, err := c.Do(ctx, r)
	if err != nil || out == nil {
		return rep, err
	}
	if err := json.Unmarshal(rep.Body, out); err != nil {
		red := Redactor{Secrets: c.Secrets}
		return rep, c.fail(r.Op, rep.Status, &adapter.UnavailableError{Detail: "decode answer: " + red.Clean(err.Error())})
	}
	return rep, nil
}
