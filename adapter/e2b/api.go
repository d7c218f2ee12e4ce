package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// DefaultDomain is E2B's production domain: the API is api.<domain> and a
// sandbox's envd is <port>-<sandboxID>.<domain> (js-sdk connectionConfig.ts).
const DefaultDomain = "e2b.app"

// EnvdPort is the port envd listens on inside every sandbox.
const EnvdPort = 49983

// NextTokenHeader is the response header that carries the list cursor of
// GET /v2/sandboxes; its absence marks the last page.
const NextTokenHeader = "X-Next-Token"

// Config configures a [Client]. Printing it with any fmt verb or through
// slog never shows the key.
type Config struct {
	// APIKey is the team's API key, sent as X-API-Key.
	APIKey Secret
	// Domain is the E2B domain; empty means [DefaultDomain].
	Domain string
	// APIURL overrides https://api.<Domain> (a self-hosted cluster, a
	// stand-in in tests).
	APIURL string
	// SandboxURL, when set, is where every envd request goes, naming its
	// sandbox in the E2b-Sandbox-Id and E2b-Sandbox-Port headers (E2B's
	// shared sandbox host and the stand-in both route on them). Empty means
	// https://<EnvdPort>-<sandboxID>.<domain>.
	SandboxURL string
	// HTTPClient is used for every request (a copy that refuses
	// redirects); nil means a client with no overall timeout (streams are
	// long), bounded by each call's context.
	HTTPClient *http.Client
	// User, when set, is the sandbox user envd runs processes as (HTTP
	// Basic with an empty password, as the SDKs send it).
	User string
}

// Client calls E2B's control plane. It is safe for concurrent use and holds
// no goroutines; there is nothing to close.
type Client struct {
	apiURL     string
	domain     string
	sandboxURL string
	user       string
	key        Secret
	call       httpcall.Caller
}

// New returns a client for cfg. It refuses an empty key and a malformed URL
// with *adapter.InvalidError.
func New(cfg Config) (*Client, error) {
	if cfg.APIKey.IsZero() {
		return nil, fail("configure e2b", 0, invalid("no API key"))
	}
	c := &Client{domain: cfg.Domain, sandboxURL: strings.TrimRight(cfg.SandboxURL, "/"), user: cfg.User, key: cfg.APIKey}
	if c.domain == "" {
		c.domain = DefaultDomain
	}
	c.apiURL = strings.TrimRight(cfg.APIURL, "/")
	if c.apiURL == "" {
		c.apiURL = "https://api." + c.domain
	}
	for _, u := range []string{c.apiURL, c.sandboxURL} {
		if u == "" {
			continue
		}
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return nil, fail("configure e2b", 0, invalid("bad URL "+strconv.Quote(u)))
		}
	}
	c.call = httpcall.Caller{
		Provider: provider,
		Accept:   "application/json",
		Base:     c.apiURL,
		// Never follows a redirect: Go re-sends X-API-Key and
		// X-Access-Token to wherever a redirect points.
		Client:  httpcall.NewClient(cfg.HTTPClient),
		Header:  func(h http.Header) { h.Set("X-API-Key", c.key.Reveal()) },
		Secrets: []Secret{c.key},
		Fail: func(r *httpcall.Request, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
			var eb apiErrorBody
			hasBody := json.Unmarshal(raw, &eb) == nil && eb.Code != nil && eb.Message != nil
			return apiStatusError(r.Op, r.Class, status, h, eb, hasBody, red)
		},
	}
	return c, nil
}

// String names the client without its key.
func (c *Client) String() string { return "e2b.Client{" + c.apiURL + "}" }

// GoString is String: %#v must not dump the key.
func (c *Client) GoString() string { return c.String() }

// NewSandbox is the body of POST /sandboxes (schema NewSandbox).
type NewSandbox struct {
	// TemplateID names the template (an id or alias).
	TemplateID string `json:"templateID"`
	// Timeout is the sandbox's time to live in seconds (0: the API's default).
	Timeout int32 `json:"timeout,omitempty"`
	// AutoPause pauses instead of killing when the timeout elapses.
	AutoPause bool `json:"autoPause,omitempty"`
	// Metadata is kept with the sandbox and filterable in List; E2B mints
	// the id, so a caller's own name belongs here.
	Metadata map[string]string `json:"metadata,omitempty"`
	// EnvVars is the environment of every process in the sandbox.
	EnvVars map[string]string `json:"envVars,omitempty"`
	// Secure asks envd to require the access token.
	Secure bool `json:"secure,omitempty"`
	// AllowInternetAccess, when set, switches egress on or off.
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
}

// Sandbox is what create, resume and connect answer (schema Sandbox) and,
// with the detail fields filled, what get and list answer (SandboxDetail,
// ListedSandbox).
type Sandbox struct {
	SandboxID   string `json:"sandboxID"`
	TemplateID  string `json:"templateID"`
	Alias       string `json:"alias,omitempty"`
	ClientID    string `json:"clientID,omitempty"`
	EnvdVersion string `json:"envdVersion"`
	// EnvdAccessToken authenticates envd requests (X-Access-Token). Only
	// create, resume, connect and get carry it.
	EnvdAccessToken Secret `json:"envdAccessToken"`
	// Domain is the sandbox's traffic domain; empty means the client's.
	Domain     string            `json:"domain,omitempty"`
	State      string            `json:"state,omitempty"` // "running" or "paused"
	Metadata   map[string]string `json:"metadata,omitempty"`
	StartedAt  time.Time         `json:"startedAt,omitzero"`
	EndAt      time.Time         `json:"endAt,omitzero"`
	CPUCount   int32             `json:"cpuCount,omitempty"`
	MemoryMB   int32             `json:"memoryMB,omitempty"`
	DiskSizeMB int32             `json:"diskSizeMB,omitempty"`
}

// The sandbox states of the API's SandboxState enum.
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// Create starts a sandbox from a template: POST /sandboxes, 201. It is not
// idempotent (every call mints a new id): never retry it blindly; a caller
// that needs a name puts it in Metadata and looks for it with List.
func (c *Client) Create(ctx context.Context, req NewSandbox) (Sandbox, error) {
	var s Sandbox
	err := c.do(ctx, "create sandbox", opOther, http.MethodPost, "/sandboxes", nil, req, []int{http.StatusCreated}, &s, nil)
	return s, err
}

// Get returns one sandbox: GET /sandboxes/{id}. A 404 with the API's error
// body is adapter.ErrNotFound; any other failure is never not_found.
func (c *Client) Get(ctx context.Context, sandboxID string) (Sandbox, error) {
	var s Sandbox
	err := c.do(ctx, "get sandbox "+sandboxID, opGetSandbox, http.MethodGet, "/sandboxes/"+url.PathEscape(sandboxID), nil, nil, []int{http.StatusOK}, &s, nil)
	return s, err
}

// ListOptions filters and pages GET /v2/sandboxes.
type ListOptions struct {
	// Metadata keeps only sandboxes whose metadata holds every pair.
	Metadata map[string]string
	// States keeps only these states (StateRunning, StatePaused); empty: all.
	States []string
	// NextToken continues from a previous page's cursor.
	NextToken string
	// Limit is the page size (the API allows 1..100; 0: its default).
	Limit int
}

// Page is one page of a listing.
type Page struct {
	Sandboxes []Sandbox
	// NextToken is the cursor of the next page; empty on the last page.
	NextToken string
}

// List returns one page: GET /v2/sandboxes. A body cut short or unparsable
// is *adapter.UnavailableError, never a short page.
func (c *Client) List(ctx context.Context, opts ListOptions) (Page, error) {
	q := url.Values{}
	if len(opts.Metadata) > 0 {
		m := url.Values{}
		for k, v := range opts.Metadata {
			m.Set(k, v)
		}
		// The API takes the filter as one url-encoded query string
		// ("user=abc&app=prod"), itself a query parameter.
		q.Set("metadata", m.Encode())
	}
	if len(opts.States) > 0 {
		q.Set("state", strings.Join(opts.States, ","))
	}
	if opts.NextToken != "" {
		q.Set("nextToken", opts.NextToken)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var p Page
	var h http.Header
	err := c.do(ctx, "list sandboxes", opOther, http.MethodGet, "/v2/sandboxes", q, nil, []int{http.StatusOK}, &p.Sandboxes, &h)
	if err != nil {
		return Page{}, err
	}
	p.NextToken = h.Get(NextTokenHeader)
	return p, nil
}

// ListAll follows the cursor to the end. An error on any page fails the
// whole listing: it never returns a partial set.
func (c *Client) ListAll(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	return hosted.ListAll(ctx, "list sandboxes", opts.NextToken, func(ctx context.Context, token string) ([]Sandbox, string, error) {
		opts.NextToken = token
		p, err := c.List(ctx, opts)
		return p.Sandboxes, p.NextToken, err
	})
}

// Delete kills a sandbox: DELETE /sandboxes/{id}, 204. An absent id gives
// an *Error with Status 404 of kind provider (confirm with Get: only its
// 404 is the definitive not_found).
func (c *Client) Delete(ctx context.Context, sandboxID string) error {
	return c.do(ctx, "delete sandbox "+sandboxID, opOther, http.MethodDelete, "/sandboxes/"+url.PathEscape(sandboxID), nil, nil, []int{http.StatusNoContent}, nil, nil)
}

// Pause pauses a running sandbox, keeping memory and disk: POST
// /sandboxes/{id}/pause, 204. Pausing a paused sandbox is 409, invalid.
func (c *Client) Pause(ctx context.Context, sandboxID string) error {
	return c.do(ctx, "pause sandbox "+sandboxID, opOther, http.MethodPost, "/sandboxes/"+url.PathEscape(sandboxID)+"/pause", nil, nil, []int{http.StatusNoContent}, nil, nil)
}

// Resume resumes a paused sandbox: POST /sandboxes/{id}/resume, 201 (the
// API marks it deprecated in favour of Connect). A running sandbox is 409.
// timeout is the new time to live in seconds.
func (c *Client) Resume(ctx context.Context, sandboxID string, timeout int32) (Sandbox, error) {
	var s Sandbox
	body := map[string]int32{"timeout": timeout}
	err := c.do(ctx, "resume sandbox "+sandboxID, opOther, http.MethodPost, "/sandboxes/"+url.PathEscape(sandboxID)+"/resume", nil, body, []int{http.StatusCreated}, &s, nil)
	return s, err
}

// Connect returns a running sandbox, resuming it when paused: POST
// /sandboxes/{id}/connect, 200 (was running) or 201 (resumed). resumed
// reports which.
func (c *Client) Connect(ctx context.Context, sandboxID string, timeout int32) (s Sandbox, resumed bool, err error) {
	body := map[string]int32{"timeout": timeout}
	var h http.Header
	status := 0
	err = c.doStatus(ctx, "connect sandbox "+sandboxID, opOther, http.MethodPost, "/sandboxes/"+url.PathEscape(sandboxID)+"/connect", nil, body, []int{http.StatusOK, http.StatusCreated}, &s, &h, &status)
	return s, status == http.StatusCreated, err
}

// SetTimeout sets a running sandbox's time to live to seconds from now:
// POST /sandboxes/{id}/timeout, 204. With NewSandbox.AutoPause the sandbox
// pauses, not dies, when it elapses.
func (c *Client) SetTimeout(ctx context.Context, sandboxID string, seconds int32) error {
	body := map[string]int32{"timeout": seconds}
	return c.do(ctx, "set timeout of sandbox "+sandboxID, opOther, http.MethodPost, "/sandboxes/"+url.PathEscape(sandboxID)+"/timeout", nil, body, []int{http.StatusNoContent}, nil, nil)
}

func (c *Client) do(ctx context.Context, op string, kind httpcall.Op, method, path string, q url.Values, in any, ok []int, out any, hdr *http.Header) error {
	return c.doStatus(ctx, op, kind, method, path, q, in, ok, out, hdr, nil)
}

// doStatus sends one control-plane request through the shared caller.
func (c *Client) doStatus(ctx context.Context, op string, kind httpcall.Op, method, path string, q url.Values, in any, ok []int, out any, hdr *http.Header, status *int) error {
	rep, err := c.call.JSON(ctx, &httpcall.Request{Op: op, Class: kind, Method: method, URL: path, Query: q, JSON: in, OK: ok}, out)
	if status != nil {
		*status = rep.Status
	}
	if hdr != nil {
		*hdr = rep.Header
	}
	return err
}

// Envd returns the envd process client of sb, authenticated with its
// access token.
func (c *Client) Envd(sb Sandbox) *Envd {
	base := c.sandboxURL
	if base == "" {
		domain := sb.Domain
		if domain == "" {
			domain = c.domain
		}
		base = fmt.Sprintf("https://%d-%s.%s", EnvdPort, sb.SandboxID, domain)
	}
	e := &Envd{base: base, sandboxID: sb.SandboxID, token: sb.EnvdAccessToken, user: c.user, hc: c.call.Client}
	e.call = httpcall.Caller{
		Provider: provider,
		Base:     base,
		Client:   e.hc,
		Header:   e.routeHeaders,
		Secrets:  []Secret{e.token},
		Fail: func(r *httpcall.Request, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
			return httpError(r.Op, status, h, raw, red)
		},
		MaxBody: MaxMessageSize,
	}
	return e
}

func invalid(detail string) error     { return &adapter.InvalidError{Detail: detail} }
func unavailable(detail string) error { return &adapter.UnavailableError{Detail: detail} }
