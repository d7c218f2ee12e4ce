package sprites

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// Defaults of AdapterConfig.
const (
	// DefaultShimPath is where the adapter uploads runner-shim in a
	// sprite: in the sprite user's home, because fs/write has no asRoot
	// flag (chmod, chown, copy, delete and rename have one), so it writes
	// as the `sprite` user, who may not write /usr/local/bin.
	DefaultShimPath = "/home/sprite/.local/bin/runner-shim"
	// DefaultTaskSocket is the Sprites Tasks API socket inside a sprite
	// ("Keeping a Sprite Running"): runner-shim holds a task there while a
	// session's command runs, so the sprite does not pause under it.
	DefaultTaskSocket = "/.sprite/api.sock"
	// DefaultRoot is runner-shim's session root, relative to the working
	// directory Sprites gives an exec (the same for every call).
	DefaultRoot = ".runner-shim"
)

const (
	// disconnectGrace is every runner-shim call's max_run_after_disconnect:
	// when the adapter lets go of a call (its context ended, its lifetime
	// passed, the driver died) Sprites kills the call's process this long
	// after (its process group, the kill endpoint's "process group").
	// The sessions runner-shim spawns are not the call's process, nor in
	// its group or below it: their shims double-fork into their own
	// session, so they live on whether Sprites kills the group or the
	// process tree.
	disconnectGrace = 5 * time.Second
	// maxCallAttempts bounds the runs of one idempotent runner-shim call
	// whose answer did not arrive.
	maxCallAttempts = 4
	// maxCallStdin bounds the stdin of one call (WriteStdin's base64 lines).
	maxCallStdin = 96 << 20
	// maxCallAnswer bounds what a one-shot call's stdout may hold.
	maxCallAnswer = 16 << 20
)

// AdapterConfig configures the contract adapter, NewAdapter.
type AdapterConfig struct {
	// Client is the API client. Required.
	Client *Client
	// Version is the runner-shim version the sprites must run (the
	// caller's version.String()). Required.
	Version string
	// ShimBinary returns the runner-shim binary of Version for Sprites'
	// linux/amd64 (images/sprites), uploaded to Shim at create. Required:
	// Sprites has no custom images, so every sprite gets it this way.
	ShimBinary func() ([]byte, error)
	// Shim is runner-shim's absolute path in the sprite (DefaultShimPath).
	Shim string
	// Root is runner-shim's session root in the sprite (DefaultRoot).
	Root string
	// Lease bounds each attach process in the sprite (guest.DefaultLease).
	Lease time.Duration
	// ReattachWindow is how long a stream attaches again after a cut
	// (guest.DefaultReattach).
	ReattachWindow time.Duration
	// TaskSocket is the Tasks API socket runner-shim holds a task on
	// while each session's command runs (DefaultTaskSocket; "-" holds
	// none). A relative path is resolved in the exec's working
	// directory (the stand-in's sprites have their "/" there).
	TaskSocket string
	// ReadyWait bounds how long Create (and Restore) wait for a new or
	// restarted sprite to take execs (DefaultReadyWait).
	ReadyWait time.Duration
}

// DefaultReadyWait is AdapterConfig.ReadyWait's default.
const DefaultReadyWait = 60 * time.Second

// Adapter is the contract (adapter.Adapter) over Sprites: sprites through
// the API (the caller's name is the sprite's name), sessions through
// runner-shim in each sprite, uploaded at create and driven over the exec
// WebSocket by adapter/guest. It is safe for concurrent use; the owner
// must call Close.
//
// Capabilities: attach, tty and terminate_session (runner-shim delivers
// them), checkpoint (Sprites' checkpoint API; a restore restarts the
// sprite and ends every session) and public_url for port 8080 only (the
// sprite's one URL, made public for the whole sprite). Not advertised:
// suspend (the API has no suspend call: a sprite pauses by itself when
// idle and wakes on any call) and network_policy (Sprites' policy is
// DNS-based and fails open in known cases, and {"rules": []} enforces
// nothing; the egress probe has never passed against it).
//
// Idleness: a sprite pauses about 30 s after its last exec; a detached
// session runs outside any exec, so runner-shim holds a Tasks API task
// while each session's command runs (AdapterConfig.TaskSocket).
//
// Exit statuses: Sprites closes about 30 % of fast execs with status 1000
// and no exit frame ([ErrNoExit]). No runner-shim call relies on an exec's
// exit status: its one-line JSON answer is the outcome (guest.ErrNoStatus).
// A call whose answer did not arrive either is run again when it is
// idempotent (version, spawn with the same --id, list, status,
// close-stdin, resize, terminate) and otherwise (write, signal) returned
// as an uncertain *adapter.UnavailableError. Session exits come from
// runner-shim's frames, never from the one-byte exit field.
//
// Secrets: an exec's argv travels in the WebSocket URL's query. The
// adapter keeps stdin bytes out of it (WriteStdin's data goes on stdin),
// but a Command's Args and Env are runner-shim spawn's argv: never put a
// secret in them on Sprites; write it to the session's stdin.
type Adapter struct {
	adapter.Unsupported
	cfg AdapterConfig

	createMu sync.Mutex // guards creating
	creating map[string]*sync.Mutex

	mu     sync.Mutex // guards guests and closed
	guests map[string]*spriteGuest
	closed bool
}

var _ adapter.Adapter = (*Adapter)(nil)

// spriteGuest is one sprite incarnation's session transport.
type spriteGuest struct {
	name string
	x    *shimExec
	g    *guest.Guest
}

// NewAdapter returns the adapter for cfg.
func NewAdapter(cfg AdapterConfig) (*Adapter, error) {
	const op = "configure sprites adapter"
	if cfg.Client == nil || cfg.Version == "" || cfg.ShimBinary == nil {
		return nil, &Error{Op: op, kind: invalid("Client, Version and ShimBinary are required")}
	}
	if cfg.Shim == "" {
		cfg.Shim = DefaultShimPath
	}
	if cfg.Shim[0] != '/' {
		return nil, &Error{Op: op, kind: invalid("Shim must be an absolute path (fs/write's target)")}
	}
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	switch cfg.TaskSocket {
	case "":
		cfg.TaskSocket = DefaultTaskSocket
	case "-":
		cfg.TaskSocket = ""
	}
	if cfg.ReadyWait <= 0 {
		cfg.ReadyWait = DefaultReadyWait
	}
	return &Adapter{cfg: cfg, creating: map[string]*sync.Mutex{}, guests: map[string]*spriteGuest{}}, nil
}

// Close stops every attach this adapter runs (sessions and sprites keep
// running). It is idempotent.
func (a *Adapter) Close() error {
	a.mu.Lock()
	a.closed = true
	gs := a.guests
	a.guests = map[string]*spriteGuest{}
	a.mu.Unlock()
	for _, sg := range gs {
		sg.g.Close()
	}
	return nil
}

// Provider returns "sprites".
func (a *Adapter) Provider() string { return provider }

// Capabilities returns what Sprites plus runner-shim deliver.
func (a *Adapter) Capabilities() adapter.Capabilities {
	return adapter.Capabilities{adapter.CapAttach, adapter.CapTTY, adapter.CapTerminateSession, adapter.CapCheckpoint, adapter.CapPublicURL}
}

// validName accepts a DNS label, the names the contract promises (and
// Sprites accepts).
func validName(name string) bool {
	if len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func handleOf(name, id string) adapter.Handle {
	return adapter.Handle{Provider: provider, Name: name, ID: id}
}

// Create returns the sprite named name, creating it when it does not
// exist, with runner-shim uploaded and its version verified. A create the
// API refuses as a duplicate (400 or 409) adopts the sprite Get shows.
// Concurrent creates of one name in this process are serialized; across
// processes the API's uniqueness of names makes them converge.
func (a *Adapter) Create(ctx context.Context, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	if !validName(name) {
		return adapter.Handle{}, &adapter.InvalidError{Detail: fmt.Sprintf("sprite name %q is not a DNS label", name)}
	}
	if opts.NetworkPolicy != nil {
		return adapter.Handle{}, fmt.Errorf("create %s with a network policy: %w", name, adapter.ErrNotSupported)
	}
	a.createMu.Lock()
	mu, ok := a.creating[name]
	if !ok {
		mu = &sync.Mutex{}
		a.creating[name] = mu
	}
	a.createMu.Unlock()
	mu.Lock()
	defer mu.Unlock()

	sp, err := a.cfg.Client.Create(ctx, CreateRequest{Name: name})
	created := err == nil
	if errors.Is(err, ErrCreateConflict) {
		var gerr error
		sp, gerr = a.cfg.Client.Get(ctx, name)
		if errors.Is(gerr, adapter.ErrNotFound) {
			// Not a duplicate after all: the create was invalid.
			return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
		}
		err = gerr
	}
	if err != nil {
		return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
	}
	if sp.ID == "" {
		return adapter.Handle{}, &adapter.ProviderError{Provider: provider, Detail: "create " + name + ": the sprite has no id"}
	}
	h := handleOf(name, sp.ID)
	sg, err := a.register(h)
	if err == nil && created {
		// A new sprite has no runner-shim: upload it now rather than learn
		// of its absence from an exec's status, which may never arrive.
		// A new sprite may not take calls at once: retried until ready.
		err = a.untilReady(ctx, func(ctx context.Context) error { return sg.x.install(ctx) })
	}
	if err == nil {
		err = a.untilReady(ctx, sg.g.Verify)
	}
	if err != nil {
		if created {
			// Nothing half-made is left: a sprite this call created is
			// deleted whatever went wrong (bounded, even when ctx ended).
			a.forget(h.ID)
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			_ = a.cfg.Client.Delete(dctx, name)
			cancel()
		}
		return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
	}
	return h, nil
}

// untilReady runs f until it succeeds, fails with something other than
// unavailable, or ReadyWait passes: a new or restored sprite is not ready
// at once (the checkpoints page: "a following sprite exec automatically
// retries while the Sprite is still coming back up").
func (a *Adapter) untilReady(ctx context.Context, f func(context.Context) error) error {
	deadline := time.Now().Add(a.cfg.ReadyWait)
	wait := 100 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil || !errors.Is(err, adapter.ErrUnavailable) || time.Now().Add(wait).After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// Get returns the sprite named name: GET /v1/sprites/{name}, whose 404
// with the API's body is the only not_found.
func (a *Adapter) Get(ctx context.Context, name string) (adapter.Handle, error) {
	if !validName(name) {
		return adapter.Handle{}, &adapter.InvalidError{Detail: fmt.Sprintf("sprite name %q is not a DNS label", name)}
	}
	sp, err := a.cfg.Client.Get(ctx, name)
	if err != nil {
		return adapter.Handle{}, fmt.Errorf("get %s: %w", name, err)
	}
	return handleOf(name, sp.ID), nil
}

// List returns one page of the organization's sprites; the API's
// continuation token is the page token.
func (a *Adapter) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	size := opts.PageSize
	if size <= 0 || size > MaxPageSize {
		size = MaxPageSize
	}
	p, err := a.cfg.Client.List(ctx, ListOptions{MaxResults: size, ContinuationToken: opts.PageToken})
	if err != nil {
		return adapter.Page{}, fmt.Errorf("list sprites: %w", err)
	}
	out := adapter.Page{NextPageToken: p.NextToken}
	for _, s := range p.Sprites {
		if !validName(s.Name) {
			continue
		}
		id := s.ID
		if id == "" {
			// A listing without ids: GET says which incarnation it is; one
			// deleted since is not listed.
			sp, err := a.cfg.Client.Get(ctx, s.Name)
			if errors.Is(err, adapter.ErrNotFound) {
				continue
			}
			if err != nil {
				return adapter.Page{}, fmt.Errorf("list sprites: %w", err)
			}
			id = sp.ID
		}
		out.Handles = append(out.Handles, handleOf(s.Name, id))
	}
	return out, nil
}

// Destroy deletes the sprite and its disk, if it is still h's
// incarnation: absent (GET's 404, or delete's) is success, and a sprite
// of the same name with another id is left alone. Sprites deletes by
// name, so a replacement created between the GET and the DELETE would be
// deleted: the window is one round trip.
func (a *Adapter) Destroy(ctx context.Context, h adapter.Handle) error {
	if h.Provider != provider || !validName(h.Name) {
		return &adapter.InvalidError{Detail: fmt.Sprintf("handle %v is not a sprite", h)}
	}
	a.forget(h.ID)
	sp, err := a.cfg.Client.Get(ctx, h.Name)
	switch {
	case errors.Is(err, adapter.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("destroy %s: %w", h.Name, err)
	case sp.ID != h.ID:
		return nil
	}
	if err := a.cfg.Client.Delete(ctx, h.Name); err != nil {
		return fmt.Errorf("destroy %s: %w", h.Name, err)
	}
	return nil
}

// forget closes and drops a sprite incarnation's transport.
func (a *Adapter) forget(id string) {
	a.mu.Lock()
	sg := a.guests[id]
	delete(a.guests, id)
	a.mu.Unlock()
	if sg != nil {
		sg.g.Close()
	}
}

// guest returns h's session transport. Every call confirms with GET that
// the sprite is still h's incarnation (another id under the name is
// not_found): Sprites addresses a sprite by name only, so without it a
// handle of a deleted sprite would drive whatever took its name. The
// window left is the one round trip between the GET and the exec.
func (a *Adapter) guest(ctx context.Context, h adapter.Handle) (*spriteGuest, error) {
	if h.Provider != provider || h.ID == "" || !validName(h.Name) {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("handle %v is not a sprite", h)}
	}
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, &adapter.InvalidError{Detail: "adapter closed"}
	}
	sp, err := a.cfg.Client.Get(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	if sp.ID != h.ID {
		a.forget(h.ID)
		return nil, fmt.Errorf("sprite %s is now %s, not %s: %w", h.Name, sp.ID, h.ID, adapter.ErrNotFound)
	}
	return a.register(h)
}

// register makes (or returns) the transport of a confirmed incarnation.
func (a *Adapter) register(h adapter.Handle) (*spriteGuest, error) {
	x := &shimExec{a: a, name: h.Name, id: h.ID}
	g, err := guest.New(guest.Config{Provider: provider, Exec: x, Shim: a.cfg.Shim, Root: a.cfg.Root,
		Version: a.cfg.Version, Install: x.install, Lease: a.cfg.Lease, ReattachWindow: a.cfg.ReattachWindow})
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if prev, ok := a.guests[h.ID]; ok && prev.name == h.Name {
		g.Close()
		return prev, nil
	}
	if a.closed {
		g.Close()
		return nil, &adapter.InvalidError{Detail: "adapter closed"}
	}
	sg := &spriteGuest{name: h.Name, x: x, g: g}
	a.guests[h.ID] = sg
	return sg, nil
}

// Exec runs c to completion in the sprite.
func (a *Adapter) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return adapter.Result{}, err
	}
	return sg.g.Exec(ctx, c)
}

// Spawn starts c as a session once runner-shim acknowledged it. The
// session id is minted here when the caller gives none, so the executor
// can run a spawn whose answer was lost again under the same --id.
func (a *Adapter) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return nil, err
	}
	if opts.SessionID == "" {
		opts.SessionID = guest.NewSessionID()
	}
	return sg.g.Spawn(ctx, c, opts)
}

// Attach rejoins session id from the cursor.
func (a *Adapter) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return sg.g.Attach(ctx, id, from)
}

// Sessions lists the sprite's sessions in start order.
func (a *Adapter) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return sg.g.Sessions(ctx)
}

// WriteStdin writes p to session id's stdin. A write whose answer did not
// arrive is never run again (it is not idempotent): it is an uncertain
// *adapter.UnavailableError, and the bytes may have arrived.
func (a *Adapter) WriteStdin(ctx context.Context, h adapter.Handle, id string, p []byte) error {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return err
	}
	return sg.g.WriteStdin(ctx, id, p)
}

// CloseStdin sends session id's stdin a real EOF.
func (a *Adapter) CloseStdin(ctx context.Context, h adapter.Handle, id string) error {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return err
	}
	return sg.g.CloseStdin(ctx, id)
}

// Resize sets a TTY session's size.
func (a *Adapter) Resize(ctx context.Context, h adapter.Handle, id string, size adapter.TTYSize) error {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return err
	}
	return sg.g.Resize(ctx, id, size)
}

// TerminateSession stops session id and returns its recorded exit.
func (a *Adapter) TerminateSession(ctx context.Context, h adapter.Handle, id string, grace time.Duration) (adapter.Exit, error) {
	if err := adapter.CheckGrace(grace); err != nil {
		return adapter.Exit{}, err
	}
	sg, err := a.guest(ctx, h)
	if err != nil {
		return adapter.Exit{}, err
	}
	return sg.g.Terminate(ctx, id, grace)
}
