package hosted

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// Driver is what one hosted provider writes: its sandbox lifecycle and
// how a sandbox is opened for calls. Every method is safe for concurrent
// use. Errors are the provider's, already in the contract's taxonomy (its
// error table); the portable Adapter wraps them with the operation and
// never reclassifies them.
type Driver interface {
	// Provider is the registry name, the Provider of every Handle.
	Provider() string
	// Capabilities is what the provider plus runner-shim deliver; the
	// portable Adapter refuses the calls behind the others.
	Capabilities() adapter.Capabilities
	// Create returns the sandbox named name (a DNS label), creating it
	// when it does not exist and adopting it when it does. Creates of one
	// name in this process never overlap.
	Create(ctx context.Context, name string, opts adapter.CreateOptions) (Created, error)
	// Get returns the live sandbox named name (a DNS label); ErrNotFound
	// only when the provider definitively says it does not exist.
	Get(ctx context.Context, name string) (adapter.Handle, error)
	// List returns one page of sandboxes, complete or an error.
	List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error)
	// Destroy removes h's sandbox; absent is success. h has an id and its
	// transport is already forgotten.
	Destroy(ctx context.Context, h adapter.Handle) error
	// Open confirms that h is a live incarnation ready for calls and
	// returns its transport. h is this provider's and has an id.
	Open(ctx context.Context, h adapter.Handle) (*Transport, error)
	// Discard is told that runner-shim could not be verified (err) in a
	// sandbox this adapter's Create made; the driver deletes it when err
	// says it can never work, so nothing half-made is left.
	Discard(ctx context.Context, h adapter.Handle, err error)
}

// Confirmer is implemented by a driver whose handles must be confirmed
// on every call, not only when the transport is opened (Sprites addresses
// a sprite by name, so a handle of a deleted sprite would otherwise drive
// whatever took its name). Confirm returns ErrNotFound for another
// incarnation and may Forget it.
type Confirmer interface {
	Confirm(ctx context.Context, h adapter.Handle) error
}

// Created is what Driver.Create found or made.
type Created struct {
	Handle adapter.Handle
	// New is true when this call made the sandbox (a failed verification
	// then goes to Driver.Discard).
	New bool
	// Parked is true for an adopted sandbox that takes no calls now (a
	// stopped Daytona sandbox): it is returned unverified.
	Parked bool
	// Transport, when not nil, is the sandbox's transport, known without
	// Open's confirmation (the create itself confirmed it).
	Transport *Transport
}

// Transport is one sandbox incarnation's way in: the provider's exec
// primitive and what runner-shim needs around it.
type Transport struct {
	// Exec runs processes in the sandbox. Required.
	Exec guest.Executor
	// Install puts runner-shim of the adapter's version at Config.Shim
	// (nil: a guest without it is refused).
	Install func(context.Context) error
	// InstallAtCreate installs runner-shim in a sandbox Create made
	// before verifying it (Sprites: a new sprite never has it).
	InstallAtCreate bool
	// TextSafe makes attaches base64 lines (guest.Config.TextSafe).
	TextSafe bool
	// Ready, when not nil, runs f until the sandbox takes calls (a new or
	// restarted sandbox may not at once); nil runs f once.
	Ready func(ctx context.Context, f func(context.Context) error) error
	// Opened, when not nil, runs once the transport is the cached one.
	Opened func(ctx context.Context)
	// Close, when not nil, runs when the transport is forgotten or the
	// adapter closes, after its Guest's attaches stopped.
	Close func()
}

func (t *Transport) ready(ctx context.Context, f func(context.Context) error) error {
	if t.Ready == nil {
		return f(ctx)
	}
	return t.Ready(ctx, f)
}

// Config is what every hosted provider's adapter configuration shares:
// each provider's AdapterConfig embeds it, and New takes it with the
// provider's Driver.
type Config struct {
	// Version is the runner-shim version every guest must run (the
	// caller's version.String()). Required.
	Version string
	// Shim is runner-shim's path or name in the guest (guest.DefaultShim,
	// or the provider's own default).
	Shim string
	// Root is runner-shim's session root in the guest (guest.DefaultRoot,
	// or the provider's own default).
	Root string
	// ShimBinary, when not nil, returns the runner-shim binary of Version
	// that the driver installs at Shim in a guest that has none (each
	// provider's docs say how, and whether it is required); nil: a guest
	// without it is refused.
	ShimBinary func() ([]byte, error)
	// Lease bounds each attach process in the guest (guest.DefaultLease,
	// or the provider's own default).
	Lease time.Duration
	// ReattachWindow is how long a stream attaches again after a cut
	// (guest.DefaultReattach).
	ReattachWindow time.Duration
}

// Adapter is the portable adapter.Sandboxes over a hosted provider's
// Driver (through the hosted core, which runs the session half in the
// guest). It is safe for concurrent use; the owner must call Close. A
// provider's adapter type embeds it; the provider's optional calls are
// found on its Driver (see [New]).
type Adapter struct {
	*adapter.Sandboxes
	c *core
}

// core is the adapter.Driver every hosted provider shares: the driver's
// lifecycle, runner-shim verified at create, and the session half in a
// cached guest per incarnation. The portable type has checked names,
// handles' names and providers, options and capabilities before a call
// reaches it.
type core struct {
	cfg  Config
	d    Driver
	caps adapter.Capabilities // declared: the driver's, less the features it does not implement

	susp adapter.Suspender      // nil: the driver has no suspend
	ckpt adapter.Checkpointer   // nil: no checkpoints
	net  adapter.NetworkPolicer // nil: no network policy
	url  adapter.PublicURLer    // nil: no public URL

	createMu sync.Mutex // guards creating
	creating map[string]*sync.Mutex

	mu     sync.Mutex // guards guests and closed
	guests map[string]*entry
	closed bool
}

var (
	_ adapter.Adapter    = (*Adapter)(nil)
	_ adapter.FullDriver = (*core)(nil)
)

// entry is one incarnation's cached session transport.
type entry struct {
	name string
	g    *guest.Guest
	t    *Transport
}

func (e *entry) close() {
	e.g.Close()
	if e.t.Close != nil {
		e.t.Close()
	}
}

// New returns the portable adapter over d. The optional calls are found
// once, here, on d: a driver that is an adapter.Suspender,
// adapter.Checkpointer, adapter.NetworkPolicer or adapter.PublicURLer
// gets that capability when it also declares it in Capabilities (attach,
// tty and terminate_session are runner-shim's, delivered by every
// guest, and advertised when declared).
func New(d Driver, cfg Config) (*Adapter, error) {
	if d == nil || cfg.Version == "" {
		return nil, &adapter.InvalidError{Detail: "hosted: a Driver and Config.Version are required"}
	}
	c := &core{cfg: cfg, d: d, creating: map[string]*sync.Mutex{}, guests: map[string]*entry{}}
	c.susp, _ = d.(adapter.Suspender)
	c.ckpt, _ = d.(adapter.Checkpointer)
	c.net, _ = d.(adapter.NetworkPolicer)
	c.url, _ = d.(adapter.PublicURLer)
	missing := map[adapter.Capability]bool{
		adapter.CapSuspend:       c.susp == nil,
		adapter.CapCheckpoint:    c.ckpt == nil,
		adapter.CapNetworkPolicy: c.net == nil,
		adapter.CapPublicURL:     c.url == nil,
	}
	for _, cp := range d.Capabilities() {
		if !missing[cp] {
			c.caps = append(c.caps, cp)
		}
	}
	return &Adapter{Sandboxes: adapter.New(c, adapter.Options{}), c: c}, nil
}

// Close stops every attach this adapter runs and closes every cached
// transport (sessions and sandboxes keep running). It is idempotent.
func (a *Adapter) Close() error { return a.c.Close() }

// Forget closes and drops the cached transport of sandbox id, if any:
// its next use opens it again (the driver calls it when a sandbox is
// gone, stopped or restored).
func (a *Adapter) Forget(id string) { a.c.Forget(id) }

// Renew replaces h's transport with t and verifies runner-shim through
// it once the sandbox takes calls (a restored disk may hold another
// runner-shim, or none).
func (a *Adapter) Renew(ctx context.Context, h adapter.Handle, t *Transport) error {
	return a.c.Renew(ctx, h, t)
}

// Guest returns h's session transport: the cached one for this
// incarnation, or one the driver opens. It is outside the Adapter
// interface, so it checks h as the portable type does: a handle without
// a name or id, with a bad name or of another provider is
// *adapter.InvalidError, and so is every call after Close.
func (a *Adapter) Guest(ctx context.Context, h adapter.Handle) (*guest.Guest, error) {
	if err := a.CheckHandle(h); err != nil {
		return nil, err
	}
	return a.c.Guest(ctx, h)
}

// Close is Adapter.Close.
func (a *core) Close() error {
	a.mu.Lock()
	a.closed = true
	gs := a.guests
	a.guests = map[string]*entry{}
	a.mu.Unlock()
	for _, e := range gs {
		e.close()
	}
	return nil
}

// Provider returns the driver's name.
func (a *core) Provider() string { return a.d.Provider() }

// Capabilities declares the driver's, less the optional features it does
// not implement.
func (a *core) Capabilities() adapter.Capabilities { return a.caps }

// Create returns the sandbox named name, made or adopted by the driver,
// with runner-shim verified in it (installed first when the transport
// says so). Concurrent creates of one name in this process are
// serialized.
func (a *core) Create(ctx context.Context, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	a.createMu.Lock()
	mu, ok := a.creating[name]
	if !ok {
		mu = &sync.Mutex{}
		a.creating[name] = mu
	}
	a.createMu.Unlock()
	mu.Lock()
	defer mu.Unlock()

	c, err := a.d.Create(ctx, name, opts)
	if err != nil {
		return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
	}
	h := c.Handle
	if c.Parked {
		return h, nil
	}
	var e *entry
	if c.Transport != nil {
		e, err = a.register(ctx, h, c.Transport)
	} else {
		e, err = a.entry(ctx, h)
	}
	if err == nil && c.New && e.t.InstallAtCreate && e.t.Install != nil {
		err = e.t.ready(ctx, e.t.Install)
	}
	if err == nil {
		// Verify at create: a sandbox without the right runner-shim is
		// refused now, not at its first command.
		err = e.t.ready(ctx, e.g.Verify)
	}
	if err != nil {
		if c.New {
			a.d.Discard(ctx, h, err)
		}
		return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
	}
	return h, nil
}

// Get returns the sandbox named name, as the driver finds it.
func (a *core) Get(ctx context.Context, name string) (adapter.Handle, error) {
	h, err := a.d.Get(ctx, name)
	if err != nil {
		return adapter.Handle{}, fmt.Errorf("get %s: %w", name, err)
	}
	return h, nil
}

// List returns one page of the driver's sandboxes.
func (a *core) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	p, err := a.d.List(ctx, opts)
	if err != nil {
		return adapter.Page{}, fmt.Errorf("list sandboxes: %w", err)
	}
	return p, nil
}

// Destroy forgets h's transport and has the driver remove the sandbox.
func (a *core) Destroy(ctx context.Context, h adapter.Handle) error {
	if h.ID == "" {
		return &adapter.InvalidError{Detail: "destroy: a handle without an id"}
	}
	a.Forget(h.ID)
	if err := a.d.Destroy(ctx, h); err != nil {
		return fmt.Errorf("destroy %s: %w", h.ID, err)
	}
	return nil
}

// Forget is Adapter.Forget.
func (a *core) Forget(id string) {
	a.mu.Lock()
	e := a.guests[id]
	delete(a.guests, id)
	a.mu.Unlock()
	if e != nil {
		e.close()
	}
}

// Renew is Adapter.Renew.
func (a *core) Renew(ctx context.Context, h adapter.Handle, t *Transport) error {
	a.Forget(h.ID)
	e, err := a.register(ctx, h, t)
	if err != nil {
		return err
	}
	return t.ready(ctx, e.g.Verify)
}

// Guest is Adapter.Guest.
func (a *core) Guest(ctx context.Context, h adapter.Handle) (*guest.Guest, error) {
	e, err := a.entry(ctx, h)
	if err != nil {
		return nil, err
	}
	return e.g, nil
}

func (a *core) entry(ctx context.Context, h adapter.Handle) (*entry, error) {
	if h.ID == "" {
		// Hosted sandboxes are addressed by incarnation.
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("handle %v names no %s incarnation", h, a.d.Provider())}
	}
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, &adapter.InvalidError{Detail: "adapter closed"}
	}
	if c, ok := a.d.(Confirmer); ok {
		if err := c.Confirm(ctx, h); err != nil {
			return nil, err
		}
	}
	a.mu.Lock()
	e, ok := a.guests[h.ID]
	a.mu.Unlock()
	if ok {
		if e.name != h.Name {
			return nil, fmt.Errorf("sandbox %s is not %q: %w", h.ID, h.Name, adapter.ErrNotFound)
		}
		return e, nil
	}
	t, err := a.d.Open(ctx, h)
	if err != nil {
		return nil, err
	}
	return a.register(ctx, h, t)
}

// register makes the Guest over t and caches it, unless another call
// cached one for h first (that one wins; t is dropped unused).
func (a *core) register(ctx context.Context, h adapter.Handle, t *Transport) (*entry, error) {
	g, err := guest.New(guest.Config{Provider: a.d.Provider(), Exec: t.Exec, Shim: a.cfg.Shim, Root: a.cfg.Root,
		Version: a.cfg.Version, Install: t.Install, TextSafe: t.TextSafe, Lease: a.cfg.Lease,
		ReattachWindow: a.cfg.ReattachWindow})
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if prev, ok := a.guests[h.ID]; ok {
		a.mu.Unlock()
		g.Close()
		if prev.name != h.Name {
			return nil, fmt.Errorf("sandbox %s is not %q: %w", h.ID, h.Name, adapter.ErrNotFound)
		}
		return prev, nil
	}
	if a.closed {
		a.mu.Unlock()
		g.Close()
		return nil, &adapter.InvalidError{Detail: "adapter closed"}
	}
	e := &entry{name: h.Name, g: g, t: t}
	a.guests[h.ID] = e
	a.mu.Unlock()
	if t.Opened != nil {
		t.Opened(ctx)
	}
	return e, nil
}
