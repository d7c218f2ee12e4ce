package fleet

// Moved sandboxes: a sandbox's name names the runner it was made on, and
// stays its route for good unless the sandbox moved (package
// client/fleet/move). A move records where the sandbox went; the pool
// keeps those records (SetRoute) and routes the name there. While a move
// runs the name answers unavailable (retry), so the pool's own callers
// never reach a copy that is being archived.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// SetRoute routes sandbox name to runner from now on (a record of a
// finished move). A route to the runner the name names is the default and
// is dropped. runner "" records a sandbox archived in a bucket, on no
// runner: its calls answer *adapter.UnavailableError until it is restored.
func (p *Pool) SetRoute(name, runner string) {
	own, _, _ := strings.Cut(name, "-")
	p.mu.Lock()
	defer p.mu.Unlock()
	if runner == own {
		delete(p.moved, name)
		return
	}
	if p.moved == nil {
		p.moved = map[string]string{}
	}
	p.moved[name] = runner
}

// RunnerOf returns the runner that holds sandbox name: the route a move
// recorded ("" for an archived sandbox), else the runner its name names.
// ok is false for a name that carries no route.
func (p *Pool) RunnerOf(name string) (runner string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runnerOfLocked(name)
}

func (p *Pool) runnerOfLocked(name string) (string, bool) {
	if r, moved := p.moved[name]; moved {
		return r, true
	}
	r, _, ok := strings.Cut(name, "-")
	return r, ok
}

// Moving marks sandbox name as being moved until the returned func is
// called: the pool's calls on it answer *adapter.UnavailableError
// meanwhile. It fails (invalid) when a move of name is already marked.
func (p *Pool) Moving(name string) (done func(), err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.moving[name] {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("sandbox %s is being moved by this pool already", name)}
	}
	if p.moving == nil {
		p.moving = map[string]bool{}
	}
	p.moving[name] = true
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.moving, name)
	}, nil
}

// Client returns the client of runner, listed by discovery now (cordoned
// or not), for calls a move makes on one runner itself. The pool owns it:
// do not Close it. Unlisted or unanswered runners are unavailable.
func (p *Pool) Client(runner string) (*client.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.members[runner]
	switch {
	case m == nil:
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("runner %s is not one of this fleet", runner)}
	case !m.listed || m.ad == nil:
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("runner %s is not listed by discovery now", runner)}
	}
	return m.c, nil
}

// Pick chooses a runner for a sandbox that moves, as Place would (two
// random choices by free capacity among listed, uncordoned runners that
// answer), never one in skip. ErrExhausted when none fits.
func (p *Pool) Pick(_ context.Context, skip ...string) (string, error) {
	s := map[string]bool{}
	for _, r := range skip {
		s[r] = true
	}
	m, ok := p.pick(s)
	if !ok {
		return "", ErrExhausted
	}
	p.mu.Lock()
	m.inflight--
	m.placed++ // the move's create counts until the next report
	p.mu.Unlock()
	return m.name, nil
}

// RouteSource is where the routes of moved sandboxes are recorded, read
// when a runner answers not_found (another process may have moved the
// sandbox) and before a destroy. Route returns the runner that holds name
// ("" when it is archived on no runner), ok false when no move recorded
// one.
type RouteSource interface {
	Route(ctx context.Context, name string) (runner string, ok bool, err error)
}

// syncRoute sets name's route from Options.Routes, when set. Failing to
// read it is unavailable: the pool cannot say where the sandbox is.
func (p *Pool) syncRoute(ctx context.Context, name string) error {
	if p.opts.Routes == nil {
		return nil
	}
	r, ok, err := p.opts.Routes.Route(ctx, name)
	if err != nil {
		return &adapter.UnavailableError{Detail: fmt.Sprintf("read the route of sandbox %s: %v", name, err)}
	}
	if ok {
		p.SetRoute(name, r)
	}
	return nil
}

// settle checks a runner's not_found for name against Options.Routes:
// only the runner that holds a sandbox can say it is gone. When the route
// names another runner (a move this pool did not make), the pool routes
// there from now on and answers unavailable, so the caller's retry
// reaches it; when the route cannot be read, unavailable too. Any other
// error, and not_found confirmed by the route, pass as they are.
func (p *Pool) settle(ctx context.Context, name string, err error) error {
	if err == nil || p.opts.Routes == nil || !errors.Is(err, adapter.ErrNotFound) {
		return err
	}
	before, _ := p.RunnerOf(name)
	if serr := p.syncRoute(ctx, name); serr != nil {
		return serr
	}
	if now, _ := p.RunnerOf(name); now != before {
		return &adapter.UnavailableError{Detail: fmt.Sprintf("sandbox %s moved from %s to %q; retry", name, before, now)}
	}
	return err
}
