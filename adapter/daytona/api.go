package daytona

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// DefaultAPIURL is Daytona's production API.
const DefaultAPIURL = "https://app.daytona.io/api"

// MaxListLimit is the largest page GET /sandbox serves.
const MaxListLimit = 200

// maxBody bounds every answer read into memory.
const maxBody = 64 << 20

// Config configures a [Client]. Printing it with any fmt verb or through
// slog never shows the key.
type Config struct {
	// APIKey is the organization's API key, sent as a Bearer token to the
	// API and to the toolbox proxy.
	APIKey Secret
	// APIURL overrides [DefaultAPIURL] (a self-hosted Daytona, a stand-in).
	APIURL string
	// OrganizationID, when set, is sent as X-Daytona-Organization-ID (a key
	// that belongs to several organizations needs it).
	OrganizationID string
	// HTTPClient is used for every request (a copy that refuses
	// redirects); nil means a client with no overall timeout, bounded by
	// each call's context.
	HTTPClient *http.Client
	// PollInterval is how often [Client.WaitState] polls; 0 means 250 ms.
	PollInterval time.Duration
}

// Client calls Daytona's API. It is safe for concurrent use and holds no
// goroutines; there is nothing to close.
type Client struct {
	apiURL string
	key    Secret
	poll   time.Duration
	call   httpcall.Caller
}

// New returns a client for cfg. It refuses an empty key and a malformed
// URL with *adapter.InvalidError.
func New(cfg Config) (*Client, error) {
	if cfg.APIKey.IsZero() {
		return nil, fail("configure daytona", 0, invalid("no API key"))
	}
	c := &Client{apiURL: strings.TrimRight(cfg.APIURL, "/"), key: cfg.APIKey, poll: cfg.PollInterval}
	if c.apiURL == "" {
		c.apiURL = DefaultAPIURL
	}
	if err := httpcall.CheckURL(c.apiURL); err != nil {
		return nil, fail("configure daytona", 0, err)
	}
	if c.poll <= 0 {
		c.poll = 250 * time.Millisecond
	}
	org := cfg.OrganizationID
	c.call = httpcall.Caller{
		Provider: provider,
		Accept:   "application/json",
		Base:     c.apiURL,
		// Never follows a redirect: a redirect to another host would carry
		// the request's headers along, and the toolbox proxy's host comes
		// from an API answer.
		Client: httpcall.NewClient(cfg.HTTPClient),
		Header: func(h http.Header) {
			h.Set("Authorization", "Bearer "+c.key.Reveal())
			if org != "" {
				h.Set("X-Daytona-Organization-ID", org)
			}
		},
		Secrets: []Secret{c.key},
		Fail: func(r *httpcall.Request, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
			return statusError(r.Op, r.Class, status, h, raw, red)
		},
		MaxBody: maxBody,
	}
	return c, nil
}

// String names the client without its key.
func (c *Client) String() string { return "daytona.Client{" + c.apiURL + "}" }

// GoString is String: %#v must not dump the key.
func (c *Client) GoString() string { return c.String() }

// CreateSandbox is the body of POST /sandbox (schema CreateSandbox).
type CreateSandbox struct {
	// Name is the caller's name for the sandbox: unique in the
	// organization, and usable wherever an id is.
	Name string `json:"name,omitempty"`
	// Snapshot names the snapshot (image) to start from; empty: the
	// organization's default.
	Snapshot string            `json:"snapshot,omitempty"`
	User     string            `json:"user,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Public   bool              `json:"public,omitempty"`
	CPU      int               `json:"cpu,omitempty"`
	Memory   int               `json:"memory,omitempty"` // GiB
	Disk     int               `json:"disk,omitempty"`   // GiB
	// AutoStopInterval is minutes of inactivity before the sandbox stops;
	// nil: the API's default (15), 0: never.
	AutoStopInterval    *int `json:"autoStopInterval,omitempty"`
	AutoArchiveInterval *int `json:"autoArchiveInterval,omitempty"`
	AutoDeleteInterval  *int `json:"autoDeleteInterval,omitempty"`
	// NetworkBlockAll blocks all egress; NetworkAllowList (comma-separated
	// CIDRs) then lets some through. The tier may refuse either.
	NetworkBlockAll  bool   `json:"networkBlockAll,omitempty"`
	NetworkAllowList string `json:"networkAllowList,omitempty"`
	Target           string `json:"target,omitempty"`
}

// Sandbox is the API's Sandbox schema (the fields this layer reads).
type Sandbox struct {
	ID               string            `json:"id"`
	Name             string            `json:"name"`
	OrganizationID   string            `json:"organizationId,omitempty"`
	Snapshot         string            `json:"snapshot,omitempty"`
	User             string            `json:"user,omitempty"`
	Env              map[string]string `json:"env,omitempty"`
	Labels           map[string]string `json:"labels,omitempty"`
	Target           string            `json:"target,omitempty"`
	CPU              float64           `json:"cpu,omitempty"`
	Memory           float64           `json:"memory,omitempty"`
	Disk             float64           `json:"disk,omitempty"`
	State            string            `json:"state"`
	ErrorReason      string            `json:"errorReason,omitempty"`
	NetworkBlockAll  bool              `json:"networkBlockAll,omitempty"`
	NetworkAllowList string            `json:"networkAllowList,omitempty"`
	// ToolboxProxyURL is the proxy in front of every sandbox's toolbox;
	// the sandbox's toolbox is at <ToolboxProxyURL>/<ID>. Older APIs leave
	// it out (then GET /sandbox/{id}/toolbox-proxy-url answers it).
	ToolboxProxyURL string    `json:"toolboxProxyUrl,omitempty"`
	CreatedAt       time.Time `json:"createdAt,omitzero"`
	UpdatedAt       time.Time `json:"updatedAt,omitzero"`
}

// The sandbox states this layer acts on (the API's SandboxState enum has
// more: restoring, archiving, pulling_snapshot, ...).
const (
	StateCreating    = "creating"
	StateStarting    = "starting"
	StateStarted     = "started"
	StateStopping    = "stopping"
	StateStopped     = "stopped"
	StateDestroying  = "destroying"
	StateDestroyed   = "destroyed"
	StateArchived    = "archived"
	StateError       = "error"
	StateBuildFailed = "build_failed"
)

// Create asks for a sandbox: POST /sandbox. It answers at once, usually
// in state creating: [Client.WaitState] waits for started. A name that is
// taken gives an error matching ErrNameTaken (kind invalid); get the
// sandbox by name to adopt it.
func (c *Client) Create(ctx context.Context, req CreateSandbox) (Sandbox, error) {
	var s Sandbox
	err := c.do(ctx, "create sandbox "+req.Name, opCreate, http.MethodPost, "/sandbox", nil, req, &s)
	return s, err
}

// Get returns one sandbox by id or name: GET /sandbox/{idOrName}. A 404
// with the API's error body is adapter.ErrNotFound; any other failure is
// never not_found. A sandbox being deleted is still found, in state
// destroying, until the platform removes it.
func (c *Client) Get(ctx context.Context, idOrName string) (Sandbox, error) {
	var s Sandbox
	err := c.do(ctx, "get sandbox "+idOrName, opGetSandbox, http.MethodGet, "/sandbox/"+url.PathEscape(idOrName), nil, nil, &s)
	return s, err
}

// WaitState polls Get until the sandbox is in state want. A sandbox in
// error or build_failed, or gone, ends the wait with an error (kind
// provider, or not_found from Get); so does the context.
func (c *Client) WaitState(ctx context.Context, idOrName, want string) (Sandbox, error) {
	t := time.NewTicker(c.poll)
	defer t.Stop()
	for {
		s, err := c.Get(ctx, idOrName)
		if err != nil {
			return Sandbox{}, err
		}
		switch s.State {
		case want:
			return s, nil
		case StateError, StateBuildFailed:
			return s, fail("wait for sandbox "+idOrName, 0, &adapter.ProviderError{Provider: provider,
				Detail: fmt.Sprintf("state %s: %s", s.State, c.redact(s.ErrorReason))})
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("wait for sandbox %s to be %s: %w", idOrName, want, ctx.Err())
		case <-t.C:
		}
	}
}

// ListOptions filters and pages GET /sandbox.
type ListOptions struct {
	// Cursor continues from a previous page's NextCursor.
	Cursor string
	// Limit is the page size, 1..MaxListLimit; 0: the API's default.
	Limit int
	// Name keeps only the sandbox with this name.
	Name string
	// Labels keeps only sandboxes that carry every pair.
	Labels map[string]string
	// States keeps only these states; empty: all but destroyed.
	States []string
}

// Page is one page of a listing.
type Page struct {
	Items []Sandbox
	// NextCursor is the cursor of the next page; empty on the last page.
	NextCursor string
}

// List returns one page: GET /sandbox?cursor&limit&name&labels&states →
// {items, nextCursor}. A body cut short, unparsable or without items is
// *adapter.UnavailableError, never a short page.
func (c *Client) List(ctx context.Context, opts ListOptions) (Page, error) {
	const opName = "list sandboxes"
	if opts.Limit < 0 || opts.Limit > MaxListLimit {
		return Page{}, fail(opName, 0, invalid(fmt.Sprintf("limit %d outside 1..%d", opts.Limit, MaxListLimit)))
	}
	q := url.Values{}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Name != "" {
		q.Set("name", opts.Name)
	}
	if len(opts.Labels) > 0 {
		// The API takes the label filter as one JSON object.
		b, err := json.Marshal(opts.Labels)
		if err != nil {
			return Page{}, fail(opName, 0, invalid("encode labels: "+err.Error()))
		}
		q.Set("labels", string(b))
	}
	for _, s := range opts.States {
		q.Add("states", s)
	}
	var body struct {
		Items      *[]Sandbox `json:"items"`
		NextCursor *string    `json:"nextCursor"`
	}
	if err := c.do(ctx, opName, opOther, http.MethodGet, "/sandbox", q, nil, &body); err != nil {
		return Page{}, err
	}
	if body.Items == nil {
		return Page{}, fail(opName, http.StatusOK, unavailable("answer has no items"))
	}
	p := Page{Items: *body.Items}
	if body.NextCursor != nil {
		p.NextCursor = *body.NextCursor
	}
	return p, nil
}

// ListAll follows the cursor to the end. An error on any page fails the
// whole listing: it never returns a partial set.
func (c *Client) ListAll(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	return hosted.ListAll(ctx, "list sandboxes", opts.Cursor, func(ctx context.Context, token string) ([]Sandbox, string, error) {
		opts.Cursor = token
		p, err := c.List(ctx, opts)
		return p.Items, p.NextCursor, err
	})
}

// Delete deletes a sandbox: DELETE /sandbox/{idOrName}. The platform
// deletes asynchronously (Get shows destroying, then 404) but frees the
// name at once: a create with the same name may follow. An absent sandbox
// gives an *Error with Status 404 of kind provider (confirm with Get: only
// its 404 is the definitive not_found).
func (c *Client) Delete(ctx context.Context, idOrName string) error {
	return c.do(ctx, "delete sandbox "+idOrName, opOther, http.MethodDelete, "/sandbox/"+url.PathEscape(idOrName), nil, nil, nil)
}

// Stop stops a started sandbox, keeping its disk: POST
// /sandbox/{idOrName}/stop. Its processes end. It answers at once; wait
// for StateStopped with WaitState.
func (c *Client) Stop(ctx context.Context, idOrName string) error {
	return c.do(ctx, "stop sandbox "+idOrName, opOther, http.MethodPost, "/sandbox/"+url.PathEscape(idOrName)+"/stop", nil, nil, nil)
}

// Start starts a stopped sandbox with the disk it had: POST
// /sandbox/{idOrName}/start. Wait for StateStarted with WaitState.
func (c *Client) Start(ctx context.Context, idOrName string) error {
	return c.do(ctx, "start sandbox "+idOrName, opOther, http.MethodPost, "/sandbox/"+url.PathEscape(idOrName)+"/start", nil, nil, nil)
}

// ToolboxProxyURL asks the API for the toolbox proxy of a sandbox: GET
// /sandbox/{id}/toolbox-proxy-url → {url}.
func (c *Client) ToolboxProxyURL(ctx context.Context, sandboxID string) (string, error) {
	var body struct {
		URL string `json:"url"`
	}
	opName := "get toolbox proxy URL of " + sandboxID
	if err := c.do(ctx, opName, opOther, http.MethodGet, "/sandbox/"+url.PathEscape(sandboxID)+"/toolbox-proxy-url", nil, nil, &body); err != nil {
		return "", err
	}
	if err := httpcall.CheckURL(body.URL); err != nil {
		return "", fail(opName, http.StatusOK, unavailable("answer has no usable URL"))
	}
	return body.URL, nil
}

// Toolbox returns the toolbox client of sb, at <toolboxProxyUrl>/<id>,
// asking the API for the proxy when sb does not name it.
func (c *Client) Toolbox(ctx context.Context, sb Sandbox) (*Toolbox, error) {
	if sb.ID == "" {
		return nil, fail("open toolbox", 0, invalid("sandbox has no id"))
	}
	proxy := sb.ToolboxProxyURL
	if proxy == "" {
		var err error
		if proxy, err = c.ToolboxProxyURL(ctx, sb.ID); err != nil {
			return nil, err
		}
	}
	if err := httpcall.CheckURL(proxy); err != nil {
		return nil, fail("open toolbox of "+sb.ID, 0, err)
	}
	return &Toolbox{c: c, base: strings.TrimRight(proxy, "/") + "/" + url.PathEscape(sb.ID), sandboxID: sb.ID}, nil
}

func (c *Client) redact(s string) string { return httpcall.Redact(c.key).Clean(s) }

// do sends one JSON request through the shared caller: the API's and the
// toolbox's calls share it.
func (c *Client) do(ctx context.Context, opName string, kind httpcall.Op, method, u string, q url.Values, in, out any) error {
	_, err := c.call.JSON(ctx, &httpcall.Request{Op: opName, Class: kind, Method: method, URL: u, Query: q, JSON: in}, out)
	return err
}

// send sends one request and returns the whole body of a 2xx answer.
func (c *Client) send(ctx context.Context, opName string, kind httpcall.Op, method, u string, q url.Values, body io.Reader, ct string, hdr http.Header) ([]byte, error) {
	rep, err := c.call.Do(ctx, &httpcall.Request{Op: opName, Class: kind, Method: method, URL: u, Query: q, Body: body, ContentType: ct, Header: hdr})
	return rep.Body, err
}
