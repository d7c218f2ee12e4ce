package client

// The Adapter's session calls: exec, spawn, attach, listing, stdin,
// resize and terminate, each routed to the runnerd holding the sandbox.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/wire"
)

func argv(c adapter.Command) []string { return append([]string{c.Path}, c.Args...) }

func newID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Exec implements adapter.Driver over POST .../exec. The session is named
// by the adapter, so when ctx ends first the command is terminated.
func (a *driver) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return adapter.Result{}, err
	}
	id := newID("exec-")
	res, err := r.c.Exec(ctx, h.Name, wire.Exec{ID: id, Argv: argv(c), Env: c.Env, Cwd: c.Dir})
	if err != nil {
		if ctx.Err() != nil {
			// Stop the command where we can; best effort, bounded.
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, _ = r.c.Terminate(tctx, h.Name, id, time.Second)
			cancel()
		}
		return adapter.Result{}, err
	}
	ex, err := stream.Exit(Provider, id, res.Exit)
	if err != nil {
		return adapter.Result{}, err
	}
	return adapter.Result{Stdout: res.Stdout, Stderr: res.Stderr, Exit: ex}, nil
}

// Spawn implements adapter.Driver: it returns once the daemon acknowledged
// that the command runs, with a Stream attached from byte zero.
func (a *driver) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	req := wire.CreateSession{ID: opts.SessionID, Argv: argv(c), Env: c.Env, Cwd: c.Dir}
	if req.ID == "" {
		req.ID = newID("s-")
	}
	if opts.TTY != nil {
		req.TTY, req.Rows, req.Cols = true, int(opts.TTY.Rows), int(opts.TTY.Cols)
	}
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return nil, err
	}
	s, _, err := r.c.CreateSession(ctx, h.Name, req)
	if err != nil {
		return nil, err
	}
	st, err := a.attach(ctx, r, h, s.ID, adapter.Cursor{}, opts.Buffer)
	if err != nil {
		return nil, fmt.Errorf("session %s started; attach to it: %w", s.ID, err)
	}
	return st, nil
}

// Attach implements adapter.Driver.
func (a *driver) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return nil, err
	}
	return a.attach(ctx, r, h, id, from, 0)
}

func (a *driver) attach(ctx context.Context, r *runner, h adapter.Handle, id string, from adapter.Cursor, buffer int) (adapter.Stream, error) {
	fr, err := r.c.Attach(ctx, h.Name, id, Cursors{Stdout: from.Stdout, Stderr: from.Stderr})
	if err != nil {
		return nil, err
	}
	if buffer <= 0 {
		buffer = a.buffer
	}
	// Each reattach is one bounded attach request under the handle's
	// incarnation; ctx ends when the consumer closes the stream.
	dial := func(ctx context.Context, cur adapter.Cursor) (stream.Conn, error) {
		ctx, cancel := context.WithTimeout(WithIncarnation(ctx, h.ID), r.c.opts.RequestTimeout)
		defer cancel()
		return r.c.Attach(ctx, h.Name, id, Cursors{Stdout: cur.Stdout, Stderr: cur.Stderr})
	}
	return stream.New(id, fr, from, dial, stream.Options{Provider: Provider, Buffer: buffer, ReattachWindow: a.window}), nil
}

// Sessions implements adapter.Driver, in start order.
func (a *driver) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return nil, err
	}
	ss, err := r.c.Sessions(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	out := make([]adapter.SessionInfo, 0, len(ss))
	for _, s := range ss {
		in := adapter.SessionInfo{ID: s.ID, TTY: s.TTY, Started: s.StartedAt, State: adapter.SessionState(s.State)}
		if len(s.Argv) > 0 {
			in.Command = adapter.Command{Path: s.Argv[0], Args: s.Argv[1:]}
		}
		// The live lengths while it runs; the final ones once it ended
		// (a daemon that predates live lengths sends only those).
		lengths := s.Lengths
		if s.Exit != nil && s.Exit.Lengths != nil {
			lengths = s.Exit.Lengths
		}
		in.Stdout, in.Stderr = lengths["stdout"], lengths["stderr"]
		if s.Exit != nil && s.State == wire.SessionExited {
			if ex, err := stream.Exit(Provider, s.ID, *s.Exit); err == nil {
				in.Exit = &ex
			}
		}
		out = append(out, in)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out, nil
}

// WriteStdin implements adapter.Driver. runnerd checks the handle's
// incarnation in the same request (no extra round trip on this hot path).
func (a *driver) WriteStdin(ctx context.Context, h adapter.Handle, id string, p []byte) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	return r.c.WriteStdin(ctx, h.Name, id, p)
}

// CloseStdin implements adapter.Driver.
func (a *driver) CloseStdin(ctx context.Context, h adapter.Handle, id string) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	return r.c.CloseStdin(ctx, h.Name, id)
}

// Resize implements adapter.Driver.
func (a *driver) Resize(ctx context.Context, h adapter.Handle, id string, size adapter.TTYSize) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	return r.c.Resize(ctx, h.Name, id, int(size.Rows), int(size.Cols))
}

// TerminateSession implements adapter.Driver.
func (a *driver) TerminateSession(ctx context.Context, h adapter.Handle, id string, grace time.Duration) (adapter.Exit, error) {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return adapter.Exit{}, err
	}
	e, err := r.c.Terminate(ctx, h.Name, id, grace)
	if err != nil {
		return adapter.Exit{}, err
	}
	return stream.Exit(Provider, id, e)
}
