package hosted

import (
	"context"
	"fmt"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// The session half: each call finds h's Guest (the incarnation check,
// the cache, the driver's Open) and runs there. The optional calls a
// provider's driver delivers (suspend, checkpoints, network policy,
// public URL) go to it; core has them only so the portable type finds
// them, and advertises them only when the driver implements them.

// Exec runs c to completion in the sandbox.
func (a *core) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return adapter.Result{}, err
	}
	return g.Exec(ctx, c)
}

// Spawn starts c as a session once runner-shim acknowledged it (the
// Guest mints the session id when opts has none, so a retry after an
// uncertain answer attaches instead of starting a second process).
func (a *core) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return g.Spawn(ctx, c, opts)
}

// Attach rejoins session id from the cursor.
func (a *core) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return g.Attach(ctx, id, from)
}

// Sessions lists the sandbox's sessions in start order.
func (a *core) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return g.Sessions(ctx)
}

// WriteStdin writes p to session id's stdin through runner-shim write.
func (a *core) WriteStdin(ctx context.Context, h adapter.Handle, id string, p []byte) error {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return err
	}
	return g.WriteStdin(ctx, id, p)
}

// CloseStdin sends session id's stdin a real EOF (runner-shim close-stdin).
func (a *core) CloseStdin(ctx context.Context, h adapter.Handle, id string) error {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return err
	}
	return g.CloseStdin(ctx, id)
}

// Resize sets a TTY session's size.
func (a *core) Resize(ctx context.Context, h adapter.Handle, id string, size adapter.TTYSize) error {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return err
	}
	return g.Resize(ctx, id, size)
}

// TerminateSession stops session id and returns its recorded exit.
func (a *core) TerminateSession(ctx context.Context, h adapter.Handle, id string, grace time.Duration) (adapter.Exit, error) {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return adapter.Exit{}, err
	}
	return g.Terminate(ctx, id, grace)
}

func notSupported(what string) error { return fmt.Errorf("%s: %w", what, adapter.ErrNotSupported) }

// Suspend is the driver's (never reached unless it implements it).
func (a *core) Suspend(ctx context.Context, h adapter.Handle) error {
	if a.susp == nil {
		return notSupported("suspend")
	}
	return a.susp.Suspend(ctx, h)
}

// Resume is the driver's.
func (a *core) Resume(ctx context.Context, h adapter.Handle) error {
	if a.susp == nil {
		return notSupported("resume")
	}
	return a.susp.Resume(ctx, h)
}

// Checkpoint is the driver's.
func (a *core) Checkpoint(ctx context.Context, h adapter.Handle) (string, error) {
	if a.ckpt == nil {
		return "", notSupported("checkpoint")
	}
	return a.ckpt.Checkpoint(ctx, h)
}

// Restore is the driver's.
func (a *core) Restore(ctx context.Context, h adapter.Handle, id string) error {
	if a.ckpt == nil {
		return notSupported("restore")
	}
	return a.ckpt.Restore(ctx, h, id)
}

// SetNetworkPolicy is the driver's.
func (a *core) SetNetworkPolicy(ctx context.Context, h adapter.Handle, p adapter.NetworkPolicy) error {
	if a.net == nil {
		return notSupported("set network policy")
	}
	return a.net.SetNetworkPolicy(ctx, h, p)
}

// PublicURL is the driver's.
func (a *core) PublicURL(ctx context.Context, h adapter.Handle, port int) (string, error) {
	if a.url == nil {
		return "", notSupported("public url")
	}
	return a.url.PublicURL(ctx, h, port)
}
