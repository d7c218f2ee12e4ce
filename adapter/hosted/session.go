package hosted

import (
	"context"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// The session half: each call finds h's Guest (handle checks, the cache,
// the driver's Open) and runs there, after the capability gate.

// Exec runs c to completion in the sandbox.
func (a *Adapter) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return adapter.Result{}, err
	}
	return g.Exec(ctx, c)
}

// Spawn starts c as a session once runner-shim acknowledged it (the
// Guest mints the session id when opts has none, so a retry after an
// uncertain answer attaches instead of starting a second process).
func (a *Adapter) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	if opts.TTY != nil {
		if err := a.gate(adapter.CapTTY, "spawn with a tty"); err != nil {
			return nil, err
		}
	}
	g, err := a.Guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return g.Spawn(ctx, c, opts)
}

// Attach rejoins session id from the cursor.
func (a *Adapter) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	if err := a.gate(adapter.CapAttach, "attach "+id); err != nil {
		return nil, err
	}
	g, err := a.Guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return g.Attach(ctx, id, from)
}

// Sessions lists the sandbox's sessions in start order.
func (a *Adapter) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return g.Sessions(ctx)
}

// WriteStdin writes p to session id's stdin through runner-shim write.
func (a *Adapter) WriteStdin(ctx context.Context, h adapter.Handle, id string, p []byte) error {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return err
	}
	return g.WriteStdin(ctx, id, p)
}

// CloseStdin sends session id's stdin a real EOF (runner-shim close-stdin).
func (a *Adapter) CloseStdin(ctx context.Context, h adapter.Handle, id string) error {
	g, err := a.Guest(ctx, h)
	if err != nil {
		return err
	}
	return g.CloseStdin(ctx, id)
}

// Resize sets a TTY session's size.
func (a *Adapter) Resize(ctx context.Context, h adapter.Handle, id string, size adapter.TTYSize) error {
	if err := a.gate(adapter.CapTTY, "resize "+id); err != nil {
		return err
	}
	g, err := a.Guest(ctx, h)
	if err != nil {
		return err
	}
	return g.Resize(ctx, id, size)
}

// TerminateSession stops session id and returns its recorded exit.
func (a *Adapter) TerminateSession(ctx context.Context, h adapter.Handle, id string, grace time.Duration) (adapter.Exit, error) {
	if err := a.gate(adapter.CapTerminateSession, "terminate "+id); err != nil {
		return adapter.Exit{}, err
	}
	if err := adapter.CheckGrace(grace); err != nil {
		return adapter.Exit{}, err
	}
	g, err := a.Guest(ctx, h)
	if err != nil {
		return adapter.Exit{}, err
	}
	return g.Terminate(ctx, id, grace)
}
