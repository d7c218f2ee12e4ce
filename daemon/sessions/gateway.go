package sessions

// The shim gateway: a shim starts one way (Config.Pool, startShim in
// spawn.go) and is reached one way, launch.DialFor with a launch.Budget
// (the one timeout policy: launch.Query, Control, Request, Check, Kill,
// Stop, StopTree), from this package only. The HTTP face asks for what a
// shim answers (marks, offsets at a time) through the methods below and
// never dials a shim itself.

import (
	"context"
	"fmt"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/wire"
)

// Marks returns the offset-time marks of stream of session ss from
// offset from, as its shim answers them (its live writer while the
// command runs, the journal's index after).
func (s *Manager) Marks(ctx context.Context, ss registry.Session, stream string, from int64) (wire.Marks, error) {
	c, _, _, err := launch.DialFor(ctx, s.Dir(ss), launch.Request)
	if err != nil {
		return wire.Marks{}, apierr.Unavailable("read marks: %v", err)
	}
	defer c.Close()
	m, err := c.Marks(ctx, stream, from)
	if err != nil {
		return wire.Marks{}, fmt.Errorf("read marks: %w", err) // classify: shim errors
	}
	if m.Marks == nil {
		m.Marks = []wire.Mark{}
	}
	return m, nil
}

// OffsetResolver turns a time into an offset per stream of one session,
// asking its shim (launch.Client.OffsetAt) over one connection made at
// the first call; Close releases it. Not safe for concurrent use.
type OffsetResolver struct {
	s  *Manager
	ss registry.Session
	c  *launch.Client
}

// Offsets returns a resolver for session ss; the caller must Close it.
func (s *Manager) Offsets(ss registry.Session) *OffsetResolver {
	return &OffsetResolver{s: s, ss: ss}
}

// OffsetAt is the first offset of stream written at or after t.
func (o *OffsetResolver) OffsetAt(ctx context.Context, stream string, t time.Time) (int64, error) {
	if o.c == nil {
		c, _, _, err := launch.DialFor(ctx, o.s.Dir(o.ss), launch.Request)
		if err != nil {
			return 0, apierr.Unavailable("resolve %s: %v", wire.QuerySince, err)
		}
		o.c = c
	}
	off, err := o.c.OffsetAt(ctx, stream, t)
	if err != nil {
		return 0, fmt.Errorf("resolve %s: %w", wire.QuerySince, err) // classify: shim errors
	}
	return off, nil
}

// Close releases the shim connection, if one was made.
func (o *OffsetResolver) Close() {
	if o.c != nil {
		o.c.Close()
	}
}
