package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/agentrunner/runner/wire"
)

// ExportSessions calls GET /v1/sandboxes/{name}/session-archive and copies
// the sandbox's ended sessions (records and journals, a tar stream) to w,
// returning the bytes copied. A sandbox with a session still running is an
// *adapter.ConflictError, before any byte. It is bounded by ctx only; a
// stream cut before its end is an *adapter.UnavailableError, and what w
// received by then no importer accepts.
func (c *Client) ExportSessions(ctx context.Context, name string, w io.Writer) (int64, error) {
	path := apiPath("sandboxes", name, "session-archive")
	op := http.MethodGet + " " + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(path, scopedQuery(ctx, path, nil)), nil)
	if err != nil {
		return 0, invalidf("%s: %v", op, err)
	}
	c.header(req.Header, false)
	req.Header.Set("Accept", wire.ContentTypeSessionArchive)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, transportErr(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, responseErr(ctx, op, resp)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, transportErr(ctx, op, fmt.Errorf("copy session archive after %d bytes: %w", n, err))
	}
	return n, nil
}

// ImportSessions calls POST /v1/sandboxes/{name}/session-archive with the
// archive read from r, and returns the sessions made: same ids, requests
// and exits, journals readable from byte 0. An id the sandbox has already
// is an *adapter.ConflictError; a malformed or hostile archive an
// *adapter.InvalidError; either way nothing is kept. Bounded by ctx only.
func (c *Client) ImportSessions(ctx context.Context, name string, r io.Reader) ([]wire.Session, error) {
	path := apiPath("sandboxes", name, "session-archive")
	op := http.MethodPost + " " + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(path, scopedQuery(ctx, path, nil)), struct{ io.Reader }{r})
	if err != nil {
		return nil, invalidf("%s: %v", op, err)
	}
	c.header(req.Header, false)
	req.Header.Set("Content-Type", wire.ContentTypeSessionArchive)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, transportErr(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return nil, responseErr(ctx, op, resp)
	}
	var out wire.SessionImport
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponse)).Decode(&out); err != nil {
		return nil, unavailablef("%s: decode response body: %v", op, err)
	}
	return out.Sessions, nil
}
