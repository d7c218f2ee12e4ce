package sprites

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
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
	// Config is the runner-shim settings every hosted provider shares.
	// Here Version and ShimBinary are required: ShimBinary returns the
	// runner-shim binary of Version for Sprites' linux/amd64
	// (images/sprites), uploaded to Shim at create (Sprites has no custom
	// images, so every sprite gets it this way). Shim is an absolute path
	// (DefaultShimPath); Root defaults to DefaultRoot.
	hosted.Config
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
	*hosted.Adapter
	cfg AdapterConfig
}

var _ adapter.Adapter = (*Adapter)(nil)

// driver is the Sprites half of hosted.Adapter: sprites by name, the exec
// WebSocket.
type driver struct{ a *Adapter }

var _ hosted.Confirmer = driver{}

// NewAdapter returns the adapter for cfg.
func NewAdapter(cfg AdapterConfig) (*Adapter, error) {
	const op = "configure sprites adapter"
	if cfg.Client == nil || cfg.Version == "" || cfg.ShimBinary == nil {
		return nil, fail(op, 0, invalid("Client, Version and ShimBinary are required"))
	}
	if cfg.Shim == "" {
		cfg.Shim = DefaultShimPath
	}
	if cfg.Shim[0] != '/' {
		return nil, fail(op, 0, invalid("Shim must be an absolute path (fs/write's target)"))
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
	a := &Adapter{cfg: cfg}
	h, err := hosted.New(driver{a}, cfg.Config)
	if err != nil {
		return nil, err
	}
	a.Adapter = h
	return a, nil
}

// forget closes and drops a sprite incarnation's transport.
func (a *Adapter) forget(id string) { a.Forget(id) }

// Provider returns "sprites".
func (driver) Provider() string { return provider }

// Capabilities returns what Sprites plus runner-shim deliver.
func (driver) Capabilities() adapter.Capabilities {
	return adapter.Capabilities{adapter.CapAttach, adapter.CapTTY, adapter.CapTerminateSession, adapter.CapCheckpoint, adapter.CapPublicURL}
}

func handleOf(name, id string) adapter.Handle {
	return adapter.Handle{Provider: provider, Name: name, ID: id}
}

// Create returns the sprite named name, creating it when it does not
// exist; a new sprite gets runner-shim uploaded before it is verified. A
// create the API refuses as a duplicate (400 or 409) adopts the sprite
// Get shows; across processes the API's uniqueness of names makes
// creates converge.
func (d driver) Create(ctx context.Context, name string, _ adapter.CreateOptions) (hosted.Created, error) {
	c := d.a.cfg.Client
	sp, err := c.Create(ctx, CreateRequest{Name: name})
	created := err == nil
	if errors.Is(err, ErrCreateConflict) {
		var gerr error
		sp, gerr = c.Get(ctx, name)
		if errors.Is(gerr, adapter.ErrNotFound) {
			// Not a duplicate after all: the create was invalid.
			return hosted.Created{}, err
		}
		err = gerr
	}
	if err != nil {
		return hosted.Created{}, err
	}
	if sp.ID == "" {
		return hosted.Created{}, &adapter.ProviderError{Provider: provider, Detail: "create " + name + ": the sprite has no id"}
	}
	h := handleOf(name, sp.ID)
	// A new sprite has no runner-shim: it is uploaded now rather than its
	// absence learnt from an exec's status, which may never arrive.
	return hosted.Created{Handle: h, New: created, Transport: d.a.transport(h)}, nil
}

// Discard deletes a sprite this adapter created, whatever went wrong:
// nothing half-made is left (bounded, even when ctx ended).
func (d driver) Discard(ctx context.Context, h adapter.Handle, _ error) {
	d.a.forget(h.ID)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	_ = d.a.cfg.Client.Delete(dctx, h.Name)
	cancel()
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
func (d driver) Get(ctx context.Context, name string) (adapter.Handle, error) {
	sp, err := d.a.cfg.Client.Get(ctx, name)
	if err != nil {
		return adapter.Handle{}, err
	}
	return handleOf(name, sp.ID), nil
}

// List returns one page of the organization's sprites; the API's
// continuation token is the page token.
func (d driver) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	size := opts.PageSize
	if size <= 0 || size > MaxPageSize {
		size = MaxPageSize
	}
	p, err := d.a.cfg.Client.List(ctx, ListOptions{MaxResults: size, ContinuationToken: opts.PageToken})
	if err != nil {
		return adapter.Page{}, err
	}
	out := adapter.Page{NextPageToken: p.NextToken}
	for _, s := range p.Sprites {
		if !adapter.ValidName(s.Name) {
			continue
		}
		id := s.ID
		if id == "" {
			// A listing without ids: GET says which incarnation it is; one
			// deleted since is not listed.
			sp, err := d.a.cfg.Client.Get(ctx, s.Name)
			if errors.Is(err, adapter.ErrNotFound) {
				continue
			}
			if err != nil {
				return adapter.Page{}, err
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
func (d driver) Destroy(ctx context.Context, h adapter.Handle) error {
	if h.Provider != provider || !adapter.ValidName(h.Name) {
		return &adapter.InvalidError{Detail: fmt.Sprintf("handle %v is not a sprite", h)}
	}
	sp, err := d.a.cfg.Client.Get(ctx, h.Name)
	switch {
	case errors.Is(err, adapter.ErrNotFound):
		return nil
	case err != nil:
		return err
	case sp.ID != h.ID:
		return nil
	}
	return d.a.cfg.Client.Delete(ctx, h.Name)
}

// Confirm checks with GET, on every call, that the sprite is still h's
// incarnation (another id under the name is not_found): Sprites addresses
// a sprite by name only, so without it a handle of a deleted sprite would
// drive whatever took its name. The window left is the one round trip
// between the GET and the exec.
func (d driver) Confirm(ctx context.Context, h adapter.Handle) error {
	if !adapter.ValidName(h.Name) {
		return &adapter.InvalidError{Detail: fmt.Sprintf("handle %v is not a sprite", h)}
	}
	sp, err := d.a.cfg.Client.Get(ctx, h.Name)
	if err != nil {
		return err
	}
	if sp.ID != h.ID {
		d.a.forget(h.ID)
		return fmt.Errorf("sprite %s is now %s, not %s: %w", h.Name, sp.ID, h.ID, adapter.ErrNotFound)
	}
	return nil
}

// Open returns the transport of an incarnation Confirm just confirmed.
func (d driver) Open(_ context.Context, h adapter.Handle) (*hosted.Transport, error) {
	return d.a.transport(h), nil
}

// transport is a confirmed incarnation's transport: runner-shim calls
// over the exec WebSocket, installed with fs/write.
func (a *Adapter) transport(h adapter.Handle) *hosted.Transport {
	x := &shimExec{a: a, name: h.Name, id: h.ID}
	return &hosted.Transport{Exec: x, Install: x.install, InstallAtCreate: true, Ready: a.untilReady}
}
