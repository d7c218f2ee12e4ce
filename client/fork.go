package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

var _ adapter.Forker = (*driver)(nil)

// ForkSandbox calls POST /v1/sandboxes with From (capability fork):
// sandbox req.Name is made with the files of checkpoint from.Checkpoint
// of from.Sandbox (its disk now when empty). The source and the checkpoint
// must exist (adapter.ErrNotFound otherwise); an existing req.Name is
// invalid (409). It is bounded by ctx only: the fork writes the whole
// checkpoint, and it is never retried.
func (c *Client) ForkSandbox(ctx context.Context, req wire.CreateSandbox, from wire.ForkFrom) (wire.Sandbox, error) {
	req.From = &from
	var sb wire.Sandbox
	err := c.do(ctx, call{method: http.MethodPost, path: apiPath("sandboxes"), body: req, unbounded: true}, &sb)
	return sb, err
}

// Fork implements adapter.Forker. The fork is made on src's runner: a
// name that routes to another runner of a pool is invalid (and a pool
// does not advertise fork, loadCaps).
func (a *driver) Fork(ctx context.Context, src adapter.Handle, checkpoint, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	r, _, err := a.check(ctx, src)
	if err != nil {
		return adapter.Handle{}, err
	}
	if a.pool {
		to, err := a.route(name)
		if err != nil {
			return adapter.Handle{}, err
		}
		if to != r {
			return adapter.Handle{}, &adapter.InvalidError{Detail: fmt.Sprintf("fork of %s (on %s) to %s (routed to %s): a fork stays on its source's runner", src.Name, r, name, to)}
		}
	}
	req := wire.CreateSandbox{Name: name}
	if opts.NetworkPolicy != nil {
		req.Network = &wire.Network{Allow: append([]string{}, opts.NetworkPolicy.Allow...)}
	}
	sb, err := r.c.ForkSandbox(ctx, req, wire.ForkFrom{Sandbox: src.Name, Incarnation: src.ID, Checkpoint: checkpoint})
	if err != nil {
		return adapter.Handle{}, err
	}
	return a.handle(sb), nil
}
