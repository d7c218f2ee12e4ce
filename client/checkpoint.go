package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// CreateCheckpoint calls POST /v1/sandboxes/{name}/checkpoints. It is
// bounded by ctx only: a checkpoint of a large disk takes as long as
// reading it.
func (c *Client) CreateCheckpoint(ctx context.Context, name, comment string) (wire.Checkpoint, error) {
	var ck wire.Checkpoint
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", name, "checkpoints"),
		body: wire.CreateCheckpoint{Comment: comment}, unbounded: true}, &ck)
	return ck, err
}

// Checkpoints calls GET /v1/sandboxes/{name}/checkpoints (oldest first).
func (c *Client) Checkpoints(ctx context.Context, name string) ([]wire.Checkpoint, error) {
	var out wire.Checkpoints
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("sandboxes", name, "checkpoints")}, &out)
	return out.Checkpoints, err
}

// GetCheckpoint calls GET /v1/sandboxes/{name}/checkpoints/{id}; an
// unknown id is invalid.
func (c *Client) GetCheckpoint(ctx context.Context, name, id string) (wire.Checkpoint, error) {
	var ck wire.Checkpoint
	err := c.do(ctx, call{method: http.MethodGet, path: apiPath("sandboxes", name, "checkpoints", id)}, &ck)
	return ck, err
}

// DeleteCheckpoint calls DELETE /v1/sandboxes/{name}/checkpoints/{id};
// an absent checkpoint is success.
func (c *Client) DeleteCheckpoint(ctx context.Context, name, id string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: apiPath("sandboxes", name, "checkpoints", id)}, nil)
}

// RestoreCheckpoint calls POST /v1/sandboxes/{name}/checkpoints/{id}/restore.
// A running sandbox is parked (its sessions end as a suspend ends them),
// restored and resumed. It is bounded by ctx only.
func (c *Client) RestoreCheckpoint(ctx context.Context, name, id string) (wire.Sandbox, error) {
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes", name, "checkpoints", id, "restore"), unbounded: true}, &sb)
	return sb, err
}

// DeleteSandboxKeepCheckpoints is DeleteSandbox that keeps the sandbox's
// checkpoints (wire.QueryKeepCheckpoints): a sandbox created later under
// the same name finds them.
func (c *Client) DeleteSandboxKeepCheckpoints(ctx context.Context, name string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: apiPath("sandboxes", name),
		query: url.Values{wire.QueryKeepCheckpoints: {"true"}}, extra: stopWait}, nil)
}

// Checkpoint implements adapter.Driver.
func (a *driver) Checkpoint(ctx context.Context, h adapter.Handle) (string, error) {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return "", err
	}
	ck, err := r.c.CreateCheckpoint(ctx, h.Name, "")
	return ck.ID, err
}

// Restore implements adapter.Driver: an unknown id is
// *adapter.InvalidError, a corrupted checkpoint
// *adapter.RestoreFailedError with the disk unchanged.
func (a *driver) Restore(ctx context.Context, h adapter.Handle, id string) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	_, err = r.c.RestoreCheckpoint(ctx, h.Name, id)
	return err
}
