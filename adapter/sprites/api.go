package sprites

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// DefaultBaseURL is the Sprites API.
const DefaultBaseURL = "https://api.sprites.dev"

// MaxPageSize is the largest max_results List accepts: the API reference
// (openapi v0.1.12) allows 1..500 (an older docs page says 1..50).
const MaxPageSize = 500

// MaxWriteFile is the largest body fs/write takes (16 MiB): WriteFile
// refuses more before sending it.
const MaxWriteFile = 16 << 20

// maxBody bounds every JSON answer read into memory.
const maxBody = 64 << 20

// Config configures a [Client]. Printing it with any fmt verb or through
// slog never shows the token.
type Config struct {
	// Token is the organization's API token, sent as "Authorization: Bearer".
	Token Secret
	// BaseURL overrides [DefaultBaseURL] (a stand-in in tests). The exec
	// WebSocket uses the same host with ws/wss.
	BaseURL string
	// HTTPClient is used for every request, the WebSocket upgrade included
	// (a copy that refuses redirects); nil means a client with no overall
	// timeout (exec sessions are long), bounded by each call's context.
	HTTPClient *http.Client
	// PingInterval is how often an exec WebSocket is pinged
	// (DefaultPingInterval, sprites-go's 15 s); negative never pings.
	PingInterval time.Duration
}

// DefaultPingInterval is Config.PingInterval's default, the SDK's.
const DefaultPingInterval = 15 * time.Second

// Client calls the Sprites API. It is safe for concurrent use and holds no
// goroutines; there is nothing to close.
type Client struct {
	base  string
	token Secret
	hc    *http.Client
	ping  time.Duration // exec keepalive interval; 0: none
	call  httpcall.Caller
}

// New returns a client for cfg. It refuses an empty token and a malformed
// URL with *adapter.InvalidError.
func New(cfg Config) (*Client, error) {
	if cfg.Token.IsZero() {
		return nil, fail("configure sprites", 0, invalid("no API token"))
	}
	base := strings.TrimRight(cfg.BaseURL, "/")
	if base == "" {
		base = DefaultBaseURL
	}
	if p, err := url.Parse(base); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.RawQuery != "" {
		return nil, fail("configure sprites", 0, invalid("bad base URL "+strconv.Quote(base)))
	}
	ping := cfg.PingInterval
	switch {
	case ping == 0:
		ping = DefaultPingInterval
	case ping < 0:
		ping = 0
	}
	// The client never follows a redirect: a 3xx is an answer here, and
	// the upgrade request must not be replayed to wherever it points.
	c := &Client{base: base, token: cfg.Token, hc: httpcall.NewClient(cfg.HTTPClient), ping: ping}
	c.call = httpcall.Caller{
		Provider: provider,
		Accept:   "application/json",
		Base:     base,
		Client:   c.hc,
		Header:   func(h http.Header) { h.Set("Authorization", "Bearer "+c.token.Reveal()) },
		Secrets:  []Secret{c.token},
		Fail: func(r *httpcall.Request, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
			eb, hasBody := parseErrorBody(raw)
			return apiStatusError(r.Op, r.Class, status, h, eb, hasBody, red)
		},
		MaxBody: maxBody,
	}
	return c, nil
}

// String names the client without its token.
func (c *Client) String() string { return "sprites.Client{" + c.base + "}" }

// GoString is String: %#v must not dump the token.
func (c *Client) GoString() string { return c.String() }

// URLSettings is a sprite's URL access configuration.
type URLSettings struct {
	// Auth is "sprite" (the default: the URL needs the token) or "public".
	Auth string `json:"auth,omitempty"`
}

// CreateRequest is the body of POST /v1/sprites.
type CreateRequest struct {
	// Name is unique within the organization; the sprite's identity.
	Name        string       `json:"name"`
	URLSettings *URLSettings `json:"url_settings,omitempty"`
	Labels      []string     `json:"labels,omitempty"`
}

// Sprite is what create and get answer.
type Sprite struct {
	ID           string       `json:"id"`
	Name         string       `json:"name"`
	Organization string       `json:"organization"`
	URL          string       `json:"url"`
	URLSettings  *URLSettings `json:"url_settings,omitempty"`
	// Status is "cold", "warm" or "running": an idle sprite goes cold and
	// keeps its disk; any call wakes it.
	Status        string     `json:"status"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	LastStartedAt *time.Time `json:"last_started_at,omitempty"`
	LastActiveAt  *time.Time `json:"last_active_at,omitempty"`
}

// The runtime statuses of a sprite.
const (
	StatusCold    = "cold"
	StatusWarm    = "warm"
	StatusRunning = "running"
)

// Create creates a sprite: POST /v1/sprites, 201. A name that may exist
// already gives an error wrapping [ErrCreateConflict] (kind invalid): Get
// the name and adopt it. Create is not retried blindly by this client.
func (c *Client) Create(ctx context.Context, req CreateRequest) (Sprite, error) {
	var s Sprite
	err := c.do(ctx, "create sprite "+req.Name, opCreate, http.MethodPost, "/v1/sprites", nil, jsonBody(req), "application/json", []int{http.StatusCreated, http.StatusOK}, &s)
	return s, err
}

// Get returns one sprite: GET /v1/sprites/{name}. A 404 with the API's
// {"error":"sprite not found"} is adapter.ErrNotFound; any other failure is
// never not_found.
func (c *Client) Get(ctx context.Context, name string) (Sprite, error) {
	var s Sprite
	err := c.do(ctx, "get sprite "+name, opGetSprite, http.MethodGet, spritePath(name), nil, nil, "", []int{http.StatusOK}, &s)
	return s, err
}

// Delete destroys a sprite and its disk: DELETE /v1/sprites/{name}, 204.
// The API's own 404 ("sprite not found") is success: the sprite is absent.
// A 404 of any other shape is *adapter.UnavailableError (it proves
// nothing, and a sprite wrongly taken for deleted would run on).
func (c *Client) Delete(ctx context.Context, name string) error {
	err := c.do(ctx, "delete sprite "+name, opDelete, http.MethodDelete, spritePath(name), nil, nil, "", []int{http.StatusNoContent, http.StatusOK}, nil)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound && e.Code == notFoundError {
		return nil
	}
	return err
}

// ListOptions filters and pages GET /v1/sprites.
type ListOptions struct {
	// Prefix keeps only sprites whose name starts with it.
	Prefix string
	// MaxResults is the page size, 1..MaxPageSize; 0 means the API's
	// default (50).
	MaxResults int
	// ContinuationToken continues from a previous page's NextToken.
	ContinuationToken string
}

// ListedSprite is one entry of a listing (SpriteEntry).
type ListedSprite struct {
	Name      string    `json:"name"`
	OrgSlug   string    `json:"org_slug"`
	ID        string    `json:"id,omitempty"`
	Status    string    `json:"status,omitempty"`
	URL       string    `json:"url,omitempty"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// Page is one page of a listing.
type Page struct {
	Sprites []ListedSprite
	// NextToken continues the listing; empty on the last page.
	NextToken string
}

// List returns one page: GET /v1/sprites. Paging is honest: a body cut
// short or not of the documented shape (sprites and has_more are
// required), or has_more without a next_continuation_token, is
// *adapter.UnavailableError, never a short page that looks whole.
func (c *Client) List(ctx context.Context, opts ListOptions) (Page, error) {
	const op = "list sprites"
	if opts.MaxResults < 0 || opts.MaxResults > MaxPageSize {
		return Page{}, fail(op, 0, invalid(fmt.Sprintf("max_results %d is outside 1..%d", opts.MaxResults, MaxPageSize)))
	}
	q := url.Values{}
	if opts.Prefix != "" {
		q.Set("prefix", opts.Prefix)
	}
	if opts.MaxResults > 0 {
		q.Set("max_results", strconv.Itoa(opts.MaxResults))
	}
	if opts.ContinuationToken != "" {
		q.Set("continuation_token", opts.ContinuationToken)
	}
	var body struct {
		Sprites   *[]ListedSprite `json:"sprites"`
		HasMore   *bool           `json:"has_more"`
		NextToken string          `json:"next_continuation_token"`
	}
	if err := c.do(ctx, op, opOther, http.MethodGet, "/v1/sprites", q, nil, "", []int{http.StatusOK}, &body); err != nil {
		return Page{}, err
	}
	if body.Sprites == nil || body.HasMore == nil {
		return Page{}, fail(op, http.StatusOK, unavailable("the answer lacks sprites or has_more"))
	}
	p := Page{Sprites: *body.Sprites}
	if *body.HasMore {
		if body.NextToken == "" {
			return Page{}, fail(op, http.StatusOK, unavailable("has_more without a continuation token"))
		}
		p.NextToken = body.NextToken
	}
	return p, nil
}

// ListAll follows the continuation tokens to the end. An error on any page
// fails the whole listing: it never returns a partial set.
func (c *Client) ListAll(ctx context.Context, opts ListOptions) ([]ListedSprite, error) {
	return hosted.ListAll(ctx, "list sprites", opts.ContinuationToken, func(ctx context.Context, token string) ([]ListedSprite, string, error) {
		opts.ContinuationToken = token
		p, err := c.List(ctx, opts)
		return p.Sprites, p.NextToken, err
	})
}

// FileInfo is fs/write's answer.
type FileInfo struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Mode string `json:"mode"`
}

// WriteFile writes data to path inside the sprite, creating parent
// directories, with permission bits perm: PUT
// /v1/sprites/{name}/fs/write?path=&workingDir=/&mode=0755&mkdirParents=true
// (how runner-shim is installed: no custom images are documented). An
// answer whose size differs from len(data) is *adapter.UnavailableError:
// the file is not what was sent.
func (c *Client) WriteFile(ctx context.Context, name, path string, data []byte, perm fs.FileMode) (FileInfo, error) {
	op := "write file " + path + " in sprite " + name
	if path == "" {
		return FileInfo{}, fail(op, 0, invalid("empty path"))
	}
	if len(data) > MaxWriteFile {
		return FileInfo{}, fail(op, 0, invalid(fmt.Sprintf("%d bytes exceed fs/write's %d", len(data), MaxWriteFile)))
	}
	q := url.Values{}
	q.Set("path", path)
	q.Set("workingDir", "/")
	q.Set("mode", fmt.Sprintf("%04o", perm.Perm()))
	q.Set("mkdirParents", "true")
	var fi FileInfo
	if err := c.do(ctx, op, opWriteFile, http.MethodPut, spritePath(name)+"/fs/write", q, data, "application/octet-stream", []int{http.StatusOK, http.StatusCreated}, &fi); err != nil {
		return FileInfo{}, err
	}
	if fi.Size != int64(len(data)) {
		return fi, fail(op, http.StatusOK, unavailable(fmt.Sprintf("the API stored %d of %d bytes", fi.Size, len(data))))
	}
	return fi, nil
}

// ReadFile returns the bytes of path inside the sprite: GET
// /v1/sprites/{name}/fs/read?path=&workingDir=/. The API's 404 gives an
// error wrapping [ErrNoFile].
func (c *Client) ReadFile(ctx context.Context, name, path string) ([]byte, error) {
	op := "read file " + path + " in sprite " + name
	q := url.Values{}
	q.Set("path", path)
	q.Set("workingDir", "/")
	var raw rawBytes
	if err := c.do(ctx, op, opReadFile, http.MethodGet, spritePath(name)+"/fs/read", q, nil, "", []int{http.StatusOK}, &raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// NetworkRule is one rule of a sprite's DNS-based egress policy.
type NetworkRule struct {
	// Domain is an exact name or a wildcard ("*.github.com").
	Domain string `json:"domain,omitempty"`
	// Action is "allow" or "deny".
	Action string `json:"action,omitempty"`
	// Include names a preset rule bundle.
	Include string `json:"include,omitempty"`
}

// NetworkPolicy is a sprite's egress policy. It is DNS-based and known to
// fail open in some cases: the adapter advertises network policy only when
// the conformance egress probe passes against it.
type NetworkPolicy struct {
	Rules []NetworkRule `json:"rules"`
}

// NetworkPolicy returns the sprite's egress policy: GET
// /v1/sprites/{name}/policy/network.
func (c *Client) NetworkPolicy(ctx context.Context, name string) (NetworkPolicy, error) {
	var p NetworkPolicy
	err := c.do(ctx, "get network policy of sprite "+name, opOther, http.MethodGet, spritePath(name)+"/policy/network", nil, nil, "", []int{http.StatusOK}, &p)
	return p, err
}

// SetNetworkPolicy replaces the sprite's egress policy: POST
// /v1/sprites/{name}/policy/network.
func (c *Client) SetNetworkPolicy(ctx context.Context, name string, p NetworkPolicy) error {
	if p.Rules == nil {
		p.Rules = []NetworkRule{}
	}
	return c.do(ctx, "set network policy of sprite "+name, opOther, http.MethodPost, spritePath(name)+"/policy/network", nil, jsonBody(p), "application/json", []int{http.StatusOK, http.StatusNoContent}, nil)
}

// rawBytes is an out value that takes the body as it is.
type rawBytes []byte

// jsonBody is a request body to encode as JSON.
type jsonBody any

func spritePath(name string) string { return "/v1/sprites/" + url.PathEscape(name) }

// do sends one request through the shared caller. in is nil, a []byte
// sent as is, or a jsonBody; out is nil, *rawBytes or a JSON target. A
// transport failure of anything but a GET may have taken effect.
func (c *Client) do(ctx context.Context, op string, kind httpcall.Op, method, path string, q url.Values, in any, contentType string, ok []int, out any) error {
	r := &httpcall.Request{Op: op, Class: kind, Method: method, URL: path, Query: q, ContentType: contentType, OK: ok, Uncertain: method != http.MethodGet}
	switch v := in.(type) {
	case nil:
	case []byte:
		r.Body = bytes.NewReader(v)
	default:
		r.JSON = v
	}
	if o, isRaw := out.(*rawBytes); isRaw {
		rep, err := c.call.Do(ctx, r)
		*o = rep.Body
		return err
	}
	_, err := c.call.JSON(ctx, r, out)
	return err
}

// SetURLAuth sets who may open the sprite's URL: PUT /v1/sprites/{name}
// {"url_settings": {"auth": auth}}, auth "public" (anyone) or "sprite"
// (the organization's token). It returns the updated sprite.
func (c *Client) SetURLAuth(ctx context.Context, name, auth string) (Sprite, error) {
	op := "set url auth of sprite " + name
	if auth != "public" && auth != "sprite" {
		return Sprite{}, fail(op, 0, invalid("auth is public or sprite"))
	}
	var s Sprite
	body := struct {
		URLSettings URLSettings `json:"url_settings"`
	}{URLSettings{Auth: auth}}
	err := c.do(ctx, op, opOther, http.MethodPut, spritePath(name), nil, jsonBody(body), "application/json", []int{http.StatusOK}, &s)
	return s, err
}
