package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentrunner/runner/wire"
)

// This file has one method per endpoint of docs/protocol.md. Each returns
// the wire type of the answer, or an error classified as in doc.go.

// Health calls GET /healthz (no token).
func (c *Client) Health(ctx context.Context) (wire.Health, error) {
	var h wire.Health
	err := c.do(ctx, call{method: http.MethodGet, path: "/healthz", noAuth: true}, &h)
	return h, err
}

// Capabilities calls GET /v1/capabilities: what this host delivers.
func (c *Client) Capabilities(ctx context.Context) ([]string, error) {
	var caps wire.Capabilities
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("capabilities")}, &caps)
	return caps.Capabilities, err
}

// Capacity calls GET /v1/capacity: what this host holds and how much
// more it takes.
func (c *Client) Capacity(ctx context.Context) (wire.Capacity, error) {
	var cp wire.Capacity
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("capacity")}, &cp)
	return cp, err
}

// Info is GET /v1/info: this runnerd's version, capabilities, capacity,
// state directory, cgroup and isolation modes and warm pool. A runnerd
// from before it answers invalid ("no such route").
func (c *Client) Info(ctx context.Context) (wire.Info, error) {
	var out wire.Info
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("info")}, &out)
	return out, err
}

// CreateSandbox calls POST /v1/sandboxes. It is idempotent: creating a
// name that exists returns the existing sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req wire.CreateSandbox) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes"), body: req}, &sb)
	return sb, err
}

// GetSandbox calls GET /v1/sandboxes/{name}. adapter.ErrNotFound (via
// errors.Is) is the definitive absence; nothing else is.
func (c *Client) GetSandbox(ctx context.Context, name string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("sandboxes", name)}, &sb)
	return sb, err
}

// ListSandboxes calls GET /v1/sandboxes for one page. limit 0 lets the
// daemon choose (100); pageToken "" starts a listing. An empty
// NextPageToken in the answer means the listing is complete.
func (c *Client) ListSandboxes(ctx context.Context, limit int, pageToken string) (wire.SandboxList, error) {
	q := url.Values{}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if pageToken != "" {
		q.Set("page_token", pageToken)
	}
	var l wire.SandboxList
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("sandboxes"), query: q}, &l)
	return l, err
}

// ListAllSandboxes drives ListSandboxes to its end. It returns every
// sandbox or an error, never a short set.
func (c *Client) ListAllSandboxes(ctx context.Context) ([]wire.Sandbox, error) {
	var all []wire.Sandbox
	token := ""
	for {
		p, err := c.ListSandboxes(ctx, wire.MaxListLimit, token)
		if err != nil {
			return nil, err
		}
		all = append(all, p.Sandboxes...)
		if p.NextPageToken == "" {
			return all, nil
		}
		if p.NextPageToken == token {
			return nil, unavailablef("list sandboxes: the daemon returned the same page token twice")
		}
		token = p.NextPageToken
	}
}

// stopWait is what the daemon may take to stop sessions before it answers
// a delete (5 s grace) or a suspend (10 s grace), plus its margin.
const stopWait = 20 * time.Second

// DeleteSandbox calls DELETE /v1/sandboxes/{name}. Absent is success.
func (c *Client) DeleteSandbox(ctx context.Context, name string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: apiPath("sandboxes", name), extra: stopWait}, nil)
}

// Suspend calls POST /v1/sandboxes/{name}/suspend.
func (c *Client) Suspend(ctx context.Context, name string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", name, "suspend"), extra: stopWait}, &sb)
	return sb, err
}

// Resume calls POST /v1/sandboxes/{name}/resume.
func (c *Client) Resume(ctx context.Context, name string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", name, "resume")}, &sb)
	return sb, err
}

// SetNetwork calls PUT /v1/sandboxes/{name}/network. An empty (non-nil)
// allow denies all egress.
func (c *Client) SetNetwork(ctx context.Context, name string, allow []string) (wire.Sandbox, error) {
	if allow == nil {
		allow = []string{}
	}
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodPut, path: apiPath("sandboxes", name, "network"), body: wire.Network{Allow: allow}}, &sb)
	return sb, err
}

// SetLimits calls PUT /v1/sandboxes/{name}/limits: l replaces the
// sandbox's limits whole (a zero field is the host's default, or none).
// adapter.ErrNotSupported without resource_limits.
func (c *Client) SetLimits(ctx context.Context, name string, l wire.Limits) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodPut, path: apiPath("sandboxes", name, "limits"), body: l}, &sb)
	return sb, err
}

// PublicURL calls POST /v1/sandboxes/{name}/urls and returns the URL. It
// is handed over whether or not something listens on port yet; PreviewURL
// also says which.
func (c *Client) PublicURL(ctx context.Context, name string, port int) (string, error) {
	u, err := c.PreviewURL(ctx, name, port)
	return u.URL, err
}

// PreviewURL calls POST /v1/sandboxes/{name}/urls and returns the whole
// answer: the URL, and whether something listened on port when runnerd
// answered (the URL works once something does). Asking again returns the
// same URL, so a caller waits for a server by asking until Listening is
// true. Listening is nil from a runnerd older than the field, which gave
// a URL only for a port something listened on.
func (c *Client) PreviewURL(ctx context.Context, name string, port int) (wire.URL, error) {
	var u wire.URL
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", name, "urls"), body: wire.URLRequest{Port: port}}, &u)
	return u, err
}

// CreateSession calls POST /v1/sandboxes/{name}/sessions and returns once
// the command runs. created is false when req.ID named a session the same
// request already started (a retry never starts a second process).
func (c *Client) CreateSession(ctx context.Context, sandbox string, req wire.CreateSession) (s wire.Session, created bool, err error) {
	var status int
	err = c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", sandbox, "sessions"), body: req, status: &status}, &s)
	return s, status == http.StatusCreated, err
}

// Sessions calls GET /v1/sandboxes/{name}/sessions page by page to its
// end: every session, in start order, or an error, never a short set.
func (c *Client) Sessions(ctx context.Context, sandbox string) ([]wire.Session, error) {
	var all []wire.Session
	token := ""
	for {
		q := url.Values{"limit": {strconv.Itoa(wire.MaxListLimit)}}
		if token != "" {
			q.Set("page_token", token)
		}
		var l wire.SessionList
		if err := c.do(ctx, call{method: http.MethodGet, path: apiPath("sandboxes", sandbox, "sessions"), query: q}, &l); err != nil {
			return nil, err
		}
		all = append(all, l.Sessions...)
		if l.NextPageToken == "" {
			return all, nil
		}
		if l.NextPageToken == token {
			return nil, unavailablef("list sessions: the daemon returned the same page token twice")
		}
		token = l.NextPageToken
	}
}

// Session calls GET /v1/sandboxes/{name}/sessions/{id}.
func (c *Client) Session(ctx context.Context, sandbox, id string) (wire.Session, error) {
	var s wire.Session
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("sandboxes", sandbox, "sessions", id)}, &s)
	return s, err
}

// WriteStdin calls POST .../stdin: p is written to the command's stdin, all
// of it, in order. adapter.ErrCommandExited once the command has ended.
func (c *Client) WriteStdin(ctx context.Context, sandbox, id string, p []byte) error {
	if len(p) > wire.MaxStdinBody {
		return invalidf("stdin write of %d bytes exceeds %d", len(p), wire.MaxStdinBody)
	}
	if p == nil {
		p = []byte{}
	}
	return c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", sandbox, "sessions", id, "stdin"), raw: p}, nil)
}

// WriteStdinAt calls POST .../stdin with the Runner-Stdin-Offset header:
// p follows the first off stdin bytes of the session. runnerd skips what
// the command already got and refuses a gap (adapter.ErrInvalid, 409),
// so after a failure that may have delivered part of p (runnerd killed
// mid-request, a cut connection, 503 uncertain) sending the same p with
// the same off again delivers each byte exactly once. An empty p writes
// nothing: it is how a caller learns the count to start from (off 0).
// It returns the session's stdin count after the write, or -1 when
// runnerd predates offsets (it then wrote p as a plain write, and a
// resend would not be deduplicated).
func (c *Client) WriteStdinAt(ctx context.Context, sandbox, id string, off int64, p []byte) (int64, error) {
	if len(p) > wire.MaxStdinBody {
		return 0, invalidf("stdin write of %d bytes exceeds %d", len(p), wire.MaxStdinBody)
	}
	if off < 0 {
		return 0, invalidf("stdin offset %d is negative", off)
	}
	if p == nil {
		p = []byte{}
	}
	var h http.Header
	err := c.do(ctx, call{
		method: http.MethodPost, path: apiPath("sandboxes", sandbox, "sessions", id, "stdin"), raw: p,
		header: http.Header{wire.HeaderStdinOffset: {strconv.FormatInt(off, 10)}}, respHeader: &h,
	}, nil)
	if err != nil {
		return 0, err
	}
	v := h.Get(wire.HeaderStdinOffset)
	if v == "" {
		return -1, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < off+int64(len(p)) {
		return 0, unavailablef("stdin write: %s %q after a write of %d bytes at %d", wire.HeaderStdinOffset, v, len(p), off)
	}
	return n, nil
}

// CloseStdin calls POST .../close-stdin: a real EOF, once.
func (c *Client) CloseStdin(ctx context.Context, sandbox, id string) error {
	return c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", sandbox, "sessions", id, "close-stdin")}, nil)
}

// Resize calls POST .../resize (TTY sessions).
func (c *Client) Resize(ctx context.Context, sandbox, id string, rows, cols int) error {
	return c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", sandbox, "sessions", id, "resize"), body: wire.Resize{Rows: rows, Cols: cols}}, nil)
}

// Signal calls POST .../signal; sig is a name ("TERM", "SIGINT") or a
// number ("9"). It goes to the command's process group.
func (c *Client) Signal(ctx context.Context, sandbox, id, sig string) error {
	return c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", sandbox, "sessions", id, "signal"), body: wire.Signal{Signal: wire.SignalName(sig)}}, nil)
}

// Terminate calls POST .../terminate: SIGTERM, SIGKILL after grace (1 ms to
// 30 s; 0 means the daemon's default of 10 s), and answers the exit record
// once it is recorded. An unconfirmed end is *adapter.UnavailableError
// (detail "uncertain"): retry.
func (c *Client) Terminate(ctx context.Context, sandbox, id string, grace time.Duration) (wire.Exit, error) {
	ms := int(grace / time.Millisecond)
	if grace > 0 && ms == 0 {
		ms = 1
	}
	wait := time.Duration(ms) * time.Millisecond
	if ms == 0 {
		wait = 10 * time.Second
	}
	var e wire.Exit
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", sandbox, "sessions", id, "terminate"),
		body: wire.Terminate{GraceMS: ms}, extra: wait + 5*time.Second}, &e)
	return e, err
}

// DeleteSession calls DELETE /v1/sandboxes/{name}/sessions/{id}: it removes
// an ended session's record, directory and journal for good. Absent is
// success. A session that runs, or whose processes outlived its command,
// is refused with the invalid kind (409): terminate it first.
func (c *Client) DeleteSession(ctx context.Context, sandbox, id string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: apiPath("sandboxes", sandbox, "sessions", id), extra: 5 * time.Second}, nil)
}

// Exec calls POST /v1/sandboxes/{name}/exec and waits for the exit. The
// request is bounded by the caller's context, req.TimeoutMS (plus the
// request timeout) when set, and a liveness check of the daemon every
// Options.ExecLiveness. Give req.ID to make a retry safe: a retry of a
// finished exec answers its recorded output.
func (c *Client) Exec(ctx context.Context, sandbox string, req wire.Exec) (wire.ExecResult, error) {
	var r wire.ExecResult
	cl := call{method: http.MethodPost, path: apiPath("sandboxes", sandbox, "exec"), body: req, unbounded: req.TimeoutMS == 0}
	if req.TimeoutMS > 0 {
		cl.extra = time.Duration(req.TimeoutMS)*time.Millisecond + 2*time.Second
	}
	err := c.doLive(ctx, cl, &r)
	return r, err
}
