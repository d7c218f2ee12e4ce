package fleet

// Routing: the adapter.Adapter methods, each sent to the runner the
// sandbox's name names (or the one a listed handle came from).

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// NewName mints a name routed to runner, as client.NewName.
func (p *Pool) NewName(runner, prefix string) string { return client.NewName(runner, prefix) }

// Provider returns "runner".
func (p *Pool) Provider() string { return client.Provider }

// Capabilities returns what every runner listed at New advertised.
func (p *Pool) Capabilities() adapter.Capabilities { return slices.Clone(p.caps) }

// String describes the pool without secrets.
func (p *Pool) String() string { return "runner fleet [" + strings.Join(p.Runners(), ", ") + "]" }

// listedOn is a listed handle's private note of the runner that listed it.
type listedOn string

// route returns the adapter of the runner that holds name, or of the
// runner h was listed on.
func (p *Pool) route(name string, priv adapter.Private) (*client.Adapter, error) {
	p.mu.Lock()
	runner, ok := p.runnerOfLocked(name) // moved.go
	if on, isListed := priv.Value().(listedOn); isListed {
		runner, ok = string(on), true
	}
	moving := p.moving[name]
	m := p.members[runner]
	var ad *client.Adapter
	listed := false
	if m != nil {
		ad, listed = m.ad, m.listed
	}
	p.mu.Unlock()
	switch {
	case ok && runner == "":
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("sandbox %s is archived in the fleet's bucket, on no runner: restore it to one", name)}
	case !ok || m == nil:
		// A runner this pool never saw: the name routes nowhere. It is
		// invalid, never not_found (absence is the runner's to say).
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("sandbox name %q carries no route of this fleet (want <runner>-<rest>)", name)}
	case moving:
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("sandbox %s is being moved", name)}
	case !listed:
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("runner %s of sandbox %s is not listed by discovery now", runner, name)}
	case ad == nil:
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("runner %s of sandbox %s has not answered", runner, name)}
	}
	return ad, nil
}

func (p *Pool) routeH(h adapter.Handle) (*client.Adapter, error) {
	if h.Name == "" {
		return nil, &adapter.InvalidError{Detail: "zero handle"}
	}
	return p.route(h.Name, h.Private)
}

// Create implements adapter.Adapter: the sandbox goes on the runner its
// name names (mint names with Place or NewName). An exhausted runner's
// answer is *client.APIError with Exhausted set.
func (p *Pool) Create(ctx context.Context, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	if _, err := p.route(name, adapter.Private{}); err != nil {
		return adapter.Handle{}, err
	}
	p.mu.Lock()
	runner, _ := p.runnerOfLocked(name)
	m := p.members[runner]
	m.inflight++
	p.mu.Unlock()
	return p.create(ctx, m, name, opts)
}

// Get implements adapter.Adapter.
func (p *Pool) Get(ctx context.Context, name string) (adapter.Handle, error) {
	ad, err := p.route(name, adapter.Private{})
	if err != nil {
		return adapter.Handle{}, err
	}
	h, err := ad.Get(ctx, name)
	return h, p.settle(ctx, name, err) // moved.go
}

// List implements adapter.Adapter: every runner the pool has seen, in
// name order. A runner not listed by discovery fails the listing (a
// listing without it would be short). Page tokens are the pool's own.
func (p *Pool) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	p.mu.Lock()
	names := make([]string, 0, len(p.members))
	for name := range p.members {
		names = append(names, name)
	}
	p.mu.Unlock()
	slices.Sort(names)
	runner, tok := names[0], ""
	if opts.PageToken != "" {
		raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(opts.PageToken, "f1."))
		r, t, ok := strings.Cut(string(raw), "\n")
		if err != nil || !ok || !strings.HasPrefix(opts.PageToken, "f1.") || !slices.Contains(names, r) {
			return adapter.Page{}, &adapter.InvalidError{Detail: "page token not issued by this fleet"}
		}
		runner, tok = r, t
	}
	ad, err := p.route(runner+"-x", adapter.Private{})
	if err != nil {
		return adapter.Page{}, err
	}
	// The runner's own adapter pages one runner; its tokens are wrapped
	// with the runner's name.
	page, err := ad.List(ctx, adapter.ListOptions{PageSize: opts.PageSize, PageToken: tok})
	if err != nil {
		return adapter.Page{}, err
	}
	for i := range page.Handles {
		page.Handles[i].Private = adapter.NewPrivate(listedOn(runner))
	}
	enc := func(r, t string) string { return "f1." + base64.RawURLEncoding.EncodeToString([]byte(r+"\n"+t)) }
	switch i := slices.Index(names, runner); {
	case page.NextPageToken != "":
		page.NextPageToken = enc(runner, page.NextPageToken)
	case i+1 < len(names):
		page.NextPageToken = enc(names[i+1], "")
	}
	return page, nil
}

// Destroy implements adapter.Adapter.
func (p *Pool) Destroy(ctx context.Context, h adapter.Handle) error {
	// A destroy of an absent sandbox succeeds: the route is read first,
	// so a moved sandbox's destroy never ends at its old runner.
	if err := p.syncRoute(ctx, h.Name); err != nil { // moved.go
		return err
	}
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return ad.Destroy(ctx, h)
}

// Exec implements adapter.Adapter.
func (p *Pool) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return adapter.Result{}, err
	}
	res, err := ad.Exec(ctx, h, c)
	return res, p.settle(ctx, h.Name, err)
}

// Spawn implements adapter.Adapter.
func (p *Pool) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return nil, err
	}
	st, err := ad.Spawn(ctx, h, c, opts)
	return st, p.settle(ctx, h.Name, err)
}

// Attach implements adapter.Adapter.
func (p *Pool) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return nil, err
	}
	st, err := ad.Attach(ctx, h, id, from)
	return st, p.settle(ctx, h.Name, err)
}

// Sessions implements adapter.Adapter.
func (p *Pool) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return nil, err
	}
	ss, err := ad.Sessions(ctx, h)
	return ss, p.settle(ctx, h.Name, err)
}

// WriteStdin implements adapter.Adapter.
func (p *Pool) WriteStdin(ctx context.Context, h adapter.Handle, id string, b []byte) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return p.settle(ctx, h.Name, ad.WriteStdin(ctx, h, id, b))
}

// CloseStdin implements adapter.Adapter.
func (p *Pool) CloseStdin(ctx context.Context, h adapter.Handle, id string) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return p.settle(ctx, h.Name, ad.CloseStdin(ctx, h, id))
}

// Resize implements adapter.Adapter.
func (p *Pool) Resize(ctx context.Context, h adapter.Handle, id string, size adapter.TTYSize) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return p.settle(ctx, h.Name, ad.Resize(ctx, h, id, size))
}

// TerminateSession implements adapter.Adapter.
func (p *Pool) TerminateSession(ctx context.Context, h adapter.Handle, id string, grace time.Duration) (adapter.Exit, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return adapter.Exit{}, err
	}
	ex, err := ad.TerminateSession(ctx, h, id, grace)
	return ex, p.settle(ctx, h.Name, err)
}

// Suspend implements adapter.Adapter.
func (p *Pool) Suspend(ctx context.Context, h adapter.Handle) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return p.settle(ctx, h.Name, ad.Suspend(ctx, h))
}

// Resume implements adapter.Adapter.
func (p *Pool) Resume(ctx context.Context, h adapter.Handle) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return p.settle(ctx, h.Name, ad.Resume(ctx, h))
}

// Checkpoint implements adapter.Adapter: runnerd does not checkpoint.
func (p *Pool) Checkpoint(ctx context.Context, h adapter.Handle) (string, error) {
	return "", fmt.Errorf("checkpoint %s: %w", h.Name, adapter.ErrNotSupported)
}

// Restore implements adapter.Adapter: runnerd does not checkpoint.
func (p *Pool) Restore(ctx context.Context, h adapter.Handle, id string) error {
	return fmt.Errorf("restore %s: %w", h.Name, adapter.ErrNotSupported)
}

// SetNetworkPolicy implements adapter.Adapter.
func (p *Pool) SetNetworkPolicy(ctx context.Context, h adapter.Handle, np adapter.NetworkPolicy) error {
	ad, err := p.routeH(h)
	if err != nil {
		return err
	}
	return p.settle(ctx, h.Name, ad.SetNetworkPolicy(ctx, h, np))
}

// PublicURL implements adapter.Adapter.
func (p *Pool) PublicURL(ctx context.Context, h adapter.Handle, port int) (string, error) {
	ad, err := p.routeH(h)
	if err != nil {
		return "", err
	}
	u, err := ad.PublicURL(ctx, h, port)
	return u, p.settle(ctx, h.Name, err)
}
