package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/agentrunner/runner/wire"
)

// ExportCheckpoint calls GET /v1/sandboxes/{name}/checkpoints/{id}/archive
// and copies the archive (docs/archive.md) to w, returning the bytes
// copied. base, when not empty, is a checkpoint of the same sandbox the
// receiver already holds: the archive then carries only the chunks base
// lacks, and a receiver without base refuses it (restore_failed). It is
// bounded by ctx only. A stream cut before its end is an
// *adapter.UnavailableError; what w received by then is an archive no
// importer accepts.
func (c *Client) ExportCheckpoint(ctx context.Context, name, id string, w io.Writer, base string) (int64, error) {
	path := apiPath("sandboxes", name, "checkpoints", id, "archive")
	op := http.MethodGet + " " + path
	var q url.Values
	if base != "" {
		q = url.Values{wire.QueryArchiveBase: {base}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(path, scopedQuery(ctx, path, q)), nil)
	if err != nil {
		return 0, invalidf("%s: %v", op, err)
	}
	c.header(req.Header, false)
	req.Header.Set("Accept", wire.ContentTypeCheckpointArchive)
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
		return n, transportErr(ctx, op, fmt.Errorf("copy archive after %d bytes: %w", n, err))
	}
	return n, nil
}

// ImportCheckpoint calls POST /v1/sandboxes/{name}/checkpoints/import
// with the archive read from r as the body, and returns the checkpoint
// and whether it is new (false: the sandbox held it already, identical,
// and nothing changed). A corrupted, truncated or hostile archive is an
// *adapter.RestoreFailedError with nothing kept; every owner in an
// imported checkpoint becomes the sandbox's (docs/protocol.md). It is
// bounded by ctx only.
func (c *Client) ImportCheckpoint(ctx context.Context, name string, r io.Reader) (wire.Checkpoint, bool, error) {
	path := apiPath("sandboxes", name, "checkpoints", "import")
	op := http.MethodPost + " " + path
	var ck wire.Checkpoint
	// The body is r itself, never buffered: net/http does not close a
	// reader it was given unless it is an io.ReadCloser (hidden here).
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(path, scopedQuery(ctx, path, nil)), struct{ io.Reader }{r})
	if err != nil {
		return ck, false, invalidf("%s: %v", op, err)
	}
	c.header(req.Header, false)
	req.Header.Set("Content-Type", wire.ContentTypeCheckpointArchive)
	resp, err := c.hc.Do(req)
	if err != nil {
		return ck, false, transportErr(ctx, op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return ck, false, responseErr(ctx, op, resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponse)).Decode(&ck); err != nil {
		return ck, false, unavailablef("%s: decode response body: %v", op, err)
	}
	return ck, resp.StatusCode == http.StatusCreated, nil
}
