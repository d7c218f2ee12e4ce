package client

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// Endpoint is one runnerd of a pool. Its Token never prints.
type Endpoint struct {
	// Name is the runner's route: 1-20 of [a-z0-9]. Sandbox names of the
	// pool start with Name + "-".
	Name string
	// URL is the endpoint for [New].
	URL string
	// Token is the bearer token.
	Token string
}

// String returns "name=url", never the token.
func (e Endpoint) String() string { return e.Name + "=" + e.URL }

// Format prints String under every verb.
func (e Endpoint) Format(f fmt.State, verb rune) { _, _ = io.WriteString(f, e.String()) }

// AdapterOptions tune an [Adapter]. The zero value is usable.
type AdapterOptions struct {
	// Client are the options of the clients NewPool makes.
	Client Options
	// Buffer is the default frame channel capacity of a Stream (64).
	Buffer int
	// ReattachWindow is how long a Stream whose connection broke (daemon
	// restarted, connection reset, heartbeat silence) keeps attaching again
	// from its cursor before it gives up with a terminal
	// *adapter.UnavailableError frame. A reattach is byte-exact: the
	// consumer sees contiguous offsets and no duplicate. 0 disables it: the
	// first break ends the stream.
	ReattachWindow time.Duration
}

// runner is one daemon of the adapter.
type runner struct {
	name string // route; "" for a single-runner adapter
	c    *Client
}

// Adapter is the runner adapter: the portable adapter.Sandboxes over one
// runnerd ([NewAdapter]) or a pool of them ([NewPool]). It is safe for
// concurrent use. Close releases the clients it made; Streams it returned
// are owned by their callers, who must Close them.
type Adapter struct {
	*adapter.Sandboxes
	d *driver
}

// driver is the runner's adapter.Driver: it routes each call to the
// runnerd holding the sandbox and scopes it to the handle's incarnation.
// It implements every optional interface; the capabilities it declares
// are those the daemon(s) advertise at GET /v1/capabilities, so the
// portable type refuses the others before a request is made.
type driver struct {
	runners []*runner
	byName  map[string]*runner // pool mode only
	pool    bool
	owned   bool                 // Close closes the clients
	caps    adapter.Capabilities // declared: what every runner advertised
	buffer  int
	window  time.Duration // ReattachWindow

	closeOnce sync.Once
}

var (
	_ adapter.Adapter    = (*Adapter)(nil)
	_ adapter.FullDriver = (*driver)(nil)
)

// NewAdapter returns the adapter for the one daemon c speaks to. It asks
// the daemon for its capabilities now (they are stable for the adapter's
// life), so it fails with *adapter.UnavailableError when the daemon does
// not answer. The caller keeps owning c.
func NewAdapter(ctx context.Context, c *Client, opts AdapterOptions) (*Adapter, error) {
	a := newDriver(opts)
	a.runners = []*runner{{c: c}}
	if err := a.loadCaps(ctx); err != nil {
		return nil, err
	}
	return a.portable(), nil
}

var runnerName = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

// NewPool returns one adapter over several daemons. Sandbox names carry
// their route (see the package doc): "<endpoint name>-<rest>". Its
// capabilities are those every endpoint advertises. The pool owns the
// clients it makes; Close releases them.
func NewPool(ctx context.Context, endpoints []Endpoint, opts AdapterOptions) (*Adapter, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("client: a pool needs at least one endpoint")
	}
	a := newDriver(opts)
	a.pool, a.owned = true, true
	a.byName = map[string]*runner{}
	for _, ep := range endpoints {
		if !runnerName.MatchString(ep.Name) {
			a.Close()
			return nil, fmt.Errorf("client: runner name %q: want 1-20 of [a-z0-9]", ep.Name)
		}
		if a.byName[ep.Name] != nil {
			a.Close()
			return nil, fmt.Errorf("client: runner name %q twice", ep.Name)
		}
		c, err := New(ep.URL, ep.Token, opts.Client)
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("client: runner %s: %w", ep.Name, err)
		}
		r := &runner{name: ep.Name, c: c}
		a.runners = append(a.runners, r)
		a.byName[ep.Name] = r
	}
	if err := a.loadCaps(ctx); err != nil {
		a.Close()
		return nil, err
	}
	return a.portable(), nil
}

func newDriver(opts AdapterOptions) *driver {
	b := opts.Buffer
	if b <= 0 {
		b = 64
	}
	return &driver{buffer: b, window: opts.ReattachWindow}
}

func (a *driver) portable() *Adapter {
	return &Adapter{Sandboxes: adapter.New(a, adapter.Options{}), d: a}
}

// loadCaps sets caps to what every runner advertises.
func (a *driver) loadCaps(ctx context.Context) error {
	count := map[adapter.Capability]int{}
	for _, r := range a.runners {
		cs, err := r.c.Capabilities(ctx)
		if err != nil {
			return fmt.Errorf("get capabilities of %s: %w", r, err)
		}
		for _, c := range slices.Compact(slices.Sorted(slices.Values(cs))) {
			count[adapter.Capability(c)]++
		}
	}
	for _, c := range adapter.AllCapabilities() {
		// A pool does not fork: the new name routes by its prefix, which
		// may name another runner than the source's (Fork refuses that),
		// so the promise would not hold for every name.
		if count[c] == len(a.runners) && !(a.pool && c == adapter.CapFork) {
			a.caps = append(a.caps, c)
		}
	}
	return nil
}

func (r *runner) String() string {
	if r.name == "" {
		return r.c.Endpoint()
	}
	return "runner " + r.name
}

// String describes the adapter without secrets.
func (a *Adapter) String() string { return a.d.String() }

func (a *driver) String() string {
	names := make([]string, len(a.runners))
	for i, r := range a.runners {
		names[i] = r.String()
	}
	return "runner adapter [" + strings.Join(names, ", ") + "]"
}

// Format prints String under every verb, so no verb prints a token.
func (a *Adapter) Format(f fmt.State, verb rune) { _, _ = io.WriteString(f, a.String()) }

// Close releases the clients the adapter made (NewPool). It is idempotent.
func (a *Adapter) Close() error { return a.d.Close() }

// Close is Adapter.Close.
func (a *driver) Close() error {
	a.closeOnce.Do(func() {
		if a.owned {
			for _, r := range a.runners {
				r.c.Close()
			}
		}
	})
	return nil
}

// Provider returns "runner".
func (a *driver) Provider() string { return Provider }

// Capabilities declares what the daemon(s) advertised at construction.
func (a *driver) Capabilities() adapter.Capabilities { return slices.Clone(a.caps) }

// NewName mints a sandbox name routed to runner ("" for a single-runner
// adapter): "<runner>-<prefix>-<8 hex>", or "<prefix>-<8 hex>" without a
// runner. prefix must be a DNS label fragment. It is the seed's
// name: {Mod, :fun, args} hook for a pool.
func (a *Adapter) NewName(runner, prefix string) string { return NewName(runner, prefix) }

// NewName is [Adapter.NewName] without an adapter.
func NewName(runner, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := prefix + "-" + hex.EncodeToString(b[:])
	if runner != "" {
		n = runner + "-" + n
	}
	return n
}

// route returns the runner that holds sandbox name.
func (a *driver) route(name string) (*runner, error) {
	if !a.pool {
		return a.runners[0], nil
	}
	prefix, _, ok := strings.Cut(name, "-")
	if r := a.byName[prefix]; ok && r != nil {
		return r, nil
	}
	return nil, &adapter.InvalidError{Detail: fmt.Sprintf("sandbox name %q carries no route of this pool (want <runner>-<rest>)", name)}
}

func (a *driver) handle(sb wire.Sandbox) adapter.Handle {
	return adapter.Handle{Provider: Provider, Name: sb.Name, ID: sb.Incarnation}
}

// Create implements adapter.Driver.
func (a *driver) Create(ctx context.Context, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	r, err := a.route(name)
	if err != nil {
		return adapter.Handle{}, err
	}
	req := wire.CreateSandbox{Name: name}
	if opts.NetworkPolicy != nil {
		req.Network = &wire.Network{Allow: append([]string{}, opts.NetworkPolicy.Allow...)}
	}
	sb, err := r.c.CreateSandbox(ctx, req)
	if err != nil {
		return adapter.Handle{}, err
	}
	return a.handle(sb), nil
}

// Get implements adapter.Driver.
func (a *driver) Get(ctx context.Context, name string) (adapter.Handle, error) {
	r, err := a.route(name)
	if err != nil {
		return adapter.Handle{}, err
	}
	sb, err := r.c.GetSandbox(ctx, name)
	if err != nil {
		return adapter.Handle{}, err
	}
	return a.handle(sb), nil
}

// check resolves h (which the portable type checked) to its runner and
// returns ctx scoped to h's incarnation (WithIncarnation): runnerd checks
// it on every call, in the same step as the call's act, so a handle of a
// destroyed incarnation is adapter.ErrNotFound (and its Destroy a no-op)
// even when a new sandbox of the same name exists, with no read-then-act
// window. A handle with an empty ID names no incarnation. It makes no
// request.
func (a *driver) check(ctx context.Context, h adapter.Handle) (*runner, context.Context, error) {
	if on, ok := h.Private.Value().(listedOn); ok && a.pool {
		// A handle from a listing addresses the runner that listed it,
		// whatever its name says (a sandbox created there directly).
		if r := a.byName[string(on)]; r != nil {
			return r, WithIncarnation(ctx, h.ID), nil
		}
	}
	r, err := a.route(h.Name)
	if err != nil {
		return nil, ctx, err
	}
	return r, WithIncarnation(ctx, h.ID), nil
}

// listedOn is a pool handle's private note of the runner whose listing
// returned it.
type listedOn string

// List implements adapter.Driver. Page tokens are the adapter's own
// ("r1." + base64 of the runner index and that runner's token).
func (a *driver) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	idx, tok, err := decodePageToken(opts.PageToken, len(a.runners))
	if err != nil {
		return adapter.Page{}, err
	}
	size := opts.PageSize
	if size > wire.MaxListLimit {
		size = wire.MaxListLimit
	}
	r := a.runners[idx]
	l, err := r.c.ListSandboxes(ctx, size, tok)
	if err != nil {
		return adapter.Page{}, err
	}
	// Every sandbox of the runner is listed, also one whose name routes
	// elsewhere or nowhere (created on the runner directly, or before a
	// pool rename): a listing that hides one is short, and honest listing
	// forbids that. Its handle carries the runner that listed it, so calls
	// on the handle reach it there.
	var p adapter.Page
	for _, sb := range l.Sandboxes {
		h := a.handle(sb)
		if a.pool {
			h.Private = adapter.NewPrivate(listedOn(r.name))
		}
		p.Handles = append(p.Handles, h)
	}
	switch {
	case l.NextPageToken != "":
		if l.NextPageToken == tok {
			return adapter.Page{}, &adapter.ProviderError{Provider: Provider, Detail: "runner repeated its page token"}
		}
		p.NextPageToken = encodePageToken(idx, l.NextPageToken)
	case idx+1 < len(a.runners):
		p.NextPageToken = encodePageToken(idx+1, "")
	}
	return p, nil
}

const pageTokenPrefix = "r1."

func encodePageToken(idx int, tok string) string {
	return pageTokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(idx)+"\n"+tok))
}

func decodePageToken(s string, n int) (int, string, error) {
	if s == "" {
		return 0, "", nil
	}
	bad := &adapter.InvalidError{Detail: "page token not issued by this adapter"}
	rest, ok := strings.CutPrefix(s, pageTokenPrefix)
	if !ok {
		return 0, "", bad
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return 0, "", bad
	}
	is, tok, ok := strings.Cut(string(b), "\n")
	idx, err := strconv.Atoi(is)
	if !ok || err != nil || idx < 0 || idx >= n {
		return 0, "", bad
	}
	return idx, tok, nil
}

// Destroy implements adapter.Driver: absent (or a replaced incarnation)
// is success and touches nothing.
func (a *driver) Destroy(ctx context.Context, h adapter.Handle) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	// runnerd answers 204 for a name that is absent or lives as another
	// incarnation than h's, and then touches nothing.
	if err := r.c.DeleteSandbox(ctx, h.Name); err != nil && !isNotFound(err) {
		return err
	}
	return nil
}

// Suspend implements adapter.Driver.
func (a *driver) Suspend(ctx context.Context, h adapter.Handle) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	_, err = r.c.Suspend(ctx, h.Name)
	return err
}

// Resume implements adapter.Driver.
func (a *driver) Resume(ctx context.Context, h adapter.Handle) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	_, err = r.c.Resume(ctx, h.Name)
	return err
}

// SetNetworkPolicy implements adapter.Driver.
func (a *driver) SetNetworkPolicy(ctx context.Context, h adapter.Handle, p adapter.NetworkPolicy) error {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return err
	}
	_, err = r.c.SetNetwork(ctx, h.Name, append([]string{}, p.Allow...))
	return err
}

// PublicURL implements adapter.Driver.
func (a *driver) PublicURL(ctx context.Context, h adapter.Handle, port int) (string, error) {
	r, ctx, err := a.check(ctx, h)
	if err != nil {
		return "", err
	}
	return r.c.PublicURL(ctx, h.Name, port)
}
