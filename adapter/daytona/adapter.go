package daytona

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// DefaultRoot is runner-shim's session root in the guest, relative to the
// working directory of the toolbox's sessions (the sandbox user's home).
const DefaultRoot = ".runner-shim"

// DefaultIODir is where the executor uploads each call's script and
// stdin, relative to the toolbox's working directory.
const DefaultIODir = ".runner-shim.io"

// DefaultLease bounds each attach in the guest. It is shorter than
// guest.DefaultLease because the executor re-reads an attach's whole log
// on every poll (the toolbox has no log offset): a shorter lease keeps
// that log small.
const DefaultLease = 10 * time.Second

// AdapterConfig configures the contract adapter, NewAdapter.
type AdapterConfig struct {
	// Client is the control-plane client. Required.
	Client *Client
	// Snapshot is the snapshot every sandbox is created from: one with
	// runner-shim of Version in it (images/daytona). Empty: the
	// organization's default snapshot, which needs ShimBinary.
	Snapshot string
	// Labels are added to every sandbox the adapter creates.
	Labels map[string]string
	// AutoStopInterval is minutes of inactivity before Daytona stops a
	// sandbox (nil: the API's default, 15; 0: never). A stopped sandbox
	// keeps its disk but not its processes.
	AutoStopInterval *int
	// Version is the runner-shim version the guest must run (the caller's
	// version.String()). Required.
	Version string
	// Shim is runner-shim's path in the guest (default "runner-shim",
	// found in the guest's PATH). Only [A-Za-z0-9._/+-].
	Shim string
	// Root is runner-shim's session root in the guest (DefaultRoot).
	Root string
	// IODir is where each call's script and stdin are uploaded
	// (DefaultIODir). Only [A-Za-z0-9._/+-].
	IODir string
	// ShimBinary, when not nil, returns the runner-shim binary to install
	// at Shim in a guest that has none (uploaded with the toolbox's files
	// API, then made executable with chmod through /process/execute);
	// nil: a guest without it is refused.
	ShimBinary func() ([]byte, error)
	// Lease bounds each attach process in the guest (DefaultLease).
	Lease time.Duration
	// ReattachWindow is how long a stream attaches again after a cut
	// (guest.DefaultReattach).
	ReattachWindow time.Duration
	// PollInterval is the executor's fastest log poll (default 25 ms); an
	// idle command is polled less often, up to 8 times slower.
	PollInterval time.Duration
}

// Adapter is the contract (adapter.Adapter) over Daytona: the control
// plane for sandboxes (Daytona takes the caller's names), and runner-shim
// in each sandbox, driven in its text-safe mode through toolbox sessions
// by adapter/guest, for sessions. It is safe for concurrent use; the
// owner must call Close.
//
// Capabilities: attach, tty and terminate_session (runner-shim delivers
// them), suspend (stop and start, which keep the disk). Not advertised:
// network_policy (the stand-in does not enforce egress, so the suite's
// egress probe cannot be passed honestly), public_url, checkpoint.
type Adapter struct {
	adapter.Unsupported
	cfg AdapterConfig

	mu     sync.Mutex // guards guests and closed
	guests map[string]*sandboxGuest
	closed bool
	// perCallSessions makes executors use a toolbox session per call,
	// deleted on the call's path (set by tests and the benchmark only).
	perCallSessions bool
}

var _ adapter.Adapter = (*Adapter)(nil)

// sandboxGuest is one sandbox's session transport.
type sandboxGuest struct {
	name string
	g    *guest.Guest
	x    *sessionExec
}

// close stops the transport's attaches, then deletes its idle toolbox
// sessions and waits for the deletes.
func (sg *sandboxGuest) close() {
	sg.g.Close()
	sg.x.Close()
}

// NewAdapter returns the adapter for cfg.
func NewAdapter(cfg AdapterConfig) (*Adapter, error) {
	const op = "configure daytona adapter"
	if cfg.Client == nil || cfg.Version == "" {
		return nil, &Error{Op: op, kind: invalid("Client and Version are required")}
	}
	if cfg.Shim == "" {
		cfg.Shim = guest.DefaultShim
	}
	if cfg.ShimBinary != nil && !containsSlash(cfg.Shim) {
		return nil, &Error{Op: op, kind: invalid("with ShimBinary, Shim is the path to install it at (a name is looked up in PATH)")}
	}
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if cfg.IODir == "" {
		cfg.IODir = DefaultIODir
	}
	if !plainPath(cfg.Shim) || !plainPath(cfg.IODir) {
		return nil, &Error{Op: op, kind: invalid("Shim and IODir may hold only letters, digits and . _ / + -")}
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 25 * time.Millisecond
	}
	return &Adapter{cfg: cfg, guests: map[string]*sandboxGuest{}}, nil
}

func containsSlash(s string) bool {
	for _, c := range []byte(s) {
		if c == '/' {
			return true
		}
	}
	return false
}

// plainPath reports whether p needs no quoting anywhere: it goes into the
// command lines that /process/execute and a session hand to the sandbox's
// shell.
func plainPath(p string) bool {
	if p == "" || p[0] == '-' {
		return false
	}
	for _, c := range []byte(p) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '/' || c == '+' || c == '-') {
			return false
		}
	}
	return true
}

// Close stops every attach this adapter runs (sessions and sandboxes keep
// running), deletes the idle toolbox sessions its executors keep, and
// waits for those deletes. It is idempotent.
func (a *Adapter) Close() error {
	a.mu.Lock()
	a.closed = true
	gs := a.guests
	a.guests = map[string]*sandboxGuest{}
	a.mu.Unlock()
	for _, sg := range gs {
		sg.close()
	}
	return nil
}

// Provider returns "daytona".
func (a *Adapter) Provider() string { return provider }

// Capabilities returns what Daytona plus runner-shim deliver.
func (a *Adapter) Capabilities() adapter.Capabilities {
	return adapter.Capabilities{adapter.CapSuspend, adapter.CapAttach, adapter.CapTTY, adapter.CapTerminateSession}
}

// validName accepts a DNS label, the names the contract promises (and a
// subset of Daytona's: letters, digits, dots, underscores and dashes).
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

func handle(sb Sandbox) adapter.Handle {
	return adapter.Handle{Provider: provider, Name: sb.Name, ID: sb.ID}
}

// gone reports whether a sandbox state means the sandbox is on its way
// out or out: its name is already free.
func gone(state string) bool { return state == StateDestroying || state == StateDestroyed }

// Create returns the sandbox named name, creating it with that name; a
// 409 (the name is taken, perhaps by this caller's earlier create whose
// answer was lost) adopts the existing one. It waits for the sandbox to
// be started and verifies (or installs) runner-shim in it.
func (a *Adapter) Create(ctx context.Context, name string, opts adapter.CreateOptions) (adapter.Handle, error) {
	if !validName(name) {
		return adapter.Handle{}, &adapter.InvalidError{Detail: fmt.Sprintf("sandbox name %q is not a DNS label", name)}
	}
	if opts.NetworkPolicy != nil {
		return adapter.Handle{}, fmt.Errorf("create %s with a network policy: %w", name, adapter.ErrNotSupported)
	}
	req := CreateSandbox{Name: name, Snapshot: a.cfg.Snapshot, Labels: a.cfg.Labels, AutoStopInterval: a.cfg.AutoStopInterval}
	sb, err := a.cfg.Client.Create(ctx, req)
	created := err == nil
	if errors.Is(err, ErrNameTaken) {
		sb, err = a.cfg.Client.Get(ctx, name)
		if err == nil && sb.Name != name {
			// The name is another sandbox's id (GET takes either).
			if sb, err = a.named(ctx, name); errors.Is(err, adapter.ErrNotFound) {
				err = &adapter.InvalidError{Detail: fmt.Sprintf("the name %q is taken by a sandbox id", name)}
			}
		}
		if err == nil && gone(sb.State) {
			// Deleted, but the name is already free: create again.
			sb, err = a.cfg.Client.Create(ctx, req)
			created = err == nil
		}
	}
	if err != nil {
		return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
	}
	if sb.State != StateStarted {
		if sb.State == StateStopped || sb.State == StateStopping {
			// An adopted, parked sandbox: its disk is what was asked for.
			return handle(sb), nil
		}
		if sb, err = a.cfg.Client.WaitState(ctx, sb.ID, StateStarted); err != nil {
			if created && errors.Is(err, adapter.ErrProvider) {
				a.cfg.Client.Delete(context.WithoutCancel(ctx), sb.ID)
			}
			return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
		}
	}
	h := handle(sb)
	// Verify runner-shim at create: a sandbox whose snapshot lacks the
	// right one is refused now, not at its first command.
	sg, err := a.guest(ctx, h)
	if err == nil {
		err = sg.g.Verify(ctx)
	}
	if err != nil {
		if created && errors.Is(err, adapter.ErrProvider) {
			a.forget(h.ID)
			a.cfg.Client.Delete(context.WithoutCancel(ctx), h.ID)
		}
		return adapter.Handle{}, fmt.Errorf("create %s: %w", name, err)
	}
	return h, nil
}

// Get returns the sandbox named name. Not found is only GET's 404 with the
// API's own body, or a sandbox already being destroyed (its name is free).
func (a *Adapter) Get(ctx context.Context, name string) (adapter.Handle, error) {
	if !validName(name) {
		return adapter.Handle{}, &adapter.InvalidError{Detail: fmt.Sprintf("sandbox name %q is not a DNS label", name)}
	}
	sb, err := a.cfg.Client.Get(ctx, name)
	if err == nil && sb.Name != name {
		// GET takes an id or a name, and a name may be another sandbox's
		// id (a UUID is a DNS label): only a complete listing filtered on
		// the name says whether one has it.
		sb, err = a.named(ctx, name)
	}
	if err != nil {
		return adapter.Handle{}, fmt.Errorf("get %s: %w", name, err)
	}
	if gone(sb.State) {
		return adapter.Handle{}, fmt.Errorf("get %s: %w", name, adapter.ErrNotFound)
	}
	return handle(sb), nil
}

// named returns the sandbox whose name is name from a complete listing;
// not_found when the complete listing has none.
func (a *Adapter) named(ctx context.Context, name string) (Sandbox, error) {
	all, err := a.cfg.Client.ListAll(ctx, ListOptions{Name: name, Limit: MaxListLimit})
	if err != nil {
		return Sandbox{}, err
	}
	for _, sb := range all {
		if sb.Name == name && !gone(sb.State) {
			return sb, nil
		}
	}
	return Sandbox{}, adapter.ErrNotFound
}

// List returns one page of sandboxes; Daytona's cursor is the page token.
// Sandboxes being destroyed and names the contract cannot hold are left
// out.
func (a *Adapter) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	limit := opts.PageSize
	if limit <= 0 || limit > MaxListLimit {
		limit = MaxListLimit
	}
	p, err := a.cfg.Client.List(ctx, ListOptions{Cursor: opts.PageToken, Limit: limit, Labels: a.cfg.Labels})
	if err != nil {
		return adapter.Page{}, fmt.Errorf("list sandboxes: %w", err)
	}
	out := adapter.Page{NextPageToken: p.NextCursor}
	for _, sb := range p.Items {
		if validName(sb.Name) && !gone(sb.State) {
			out.Handles = append(out.Handles, handle(sb))
		}
	}
	return out, nil
}

// Destroy deletes the sandbox (asynchronously, at Daytona). Absent (a 404
// on delete, confirmed by GET's 404) is success.
func (a *Adapter) Destroy(ctx context.Context, h adapter.Handle) error {
	if h.ID == "" {
		return &adapter.InvalidError{Detail: "destroy: a handle without an id"}
	}
	a.forget(h.ID)
	err := a.cfg.Client.Delete(ctx, h.ID)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		if _, gerr := a.cfg.Client.Get(ctx, h.ID); errors.Is(gerr, adapter.ErrNotFound) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("destroy %s: %w", h.ID, err)
	}
	return nil
}

// Suspend stops the sandbox (Daytona keeps its disk; its processes end)
// and waits until it is stopped. A stopped sandbox is left as it is.
func (a *Adapter) Suspend(ctx context.Context, h adapter.Handle) error {
	sb, err := a.sandbox(ctx, h)
	if err != nil {
		return fmt.Errorf("suspend %s: %w", h.Name, err)
	}
	a.forget(h.ID)
	switch sb.State {
	case StateStopped:
		return nil
	case StateStopping:
	default:
		if sb.State != StateStarted {
			if sb, err = a.cfg.Client.WaitState(ctx, h.ID, StateStarted); err != nil {
				return fmt.Errorf("suspend %s: %w", h.Name, err)
			}
		}
		if err := a.cfg.Client.Stop(ctx, h.ID); err != nil {
			return fmt.Errorf("suspend %s: %w", h.Name, err)
		}
	}
	if _, err := a.cfg.Client.WaitState(ctx, h.ID, StateStopped); err != nil {
		return fmt.Errorf("suspend %s: %w", h.Name, err)
	}
	return nil
}

// Resume starts a stopped sandbox with the disk it had and waits until it
// is started. A started sandbox is left as it is.
func (a *Adapter) Resume(ctx context.Context, h adapter.Handle) error {
	sb, err := a.sandbox(ctx, h)
	if err != nil {
		return fmt.Errorf("resume %s: %w", h.Name, err)
	}
	switch sb.State {
	case StateStarted:
		return nil
	case StateStopping:
		if _, err := a.cfg.Client.WaitState(ctx, h.ID, StateStopped); err != nil {
			return fmt.Errorf("resume %s: %w", h.Name, err)
		}
		fallthrough
	case StateStopped, StateArchived:
		if err := a.cfg.Client.Start(ctx, h.ID); err != nil {
			return fmt.Errorf("resume %s: %w", h.Name, err)
		}
	}
	if _, err := a.cfg.Client.WaitState(ctx, h.ID, StateStarted); err != nil {
		return fmt.Errorf("resume %s: %w", h.Name, err)
	}
	return nil
}

// sandbox GETs h's sandbox and checks it is this incarnation of h.Name.
func (a *Adapter) sandbox(ctx context.Context, h adapter.Handle) (Sandbox, error) {
	if h.ID == "" || h.Provider != provider {
		return Sandbox{}, &adapter.InvalidError{Detail: fmt.Sprintf("handle %v is not a daytona sandbox", h)}
	}
	sb, err := a.cfg.Client.Get(ctx, h.ID)
	if err != nil {
		if errors.Is(err, adapter.ErrNotFound) {
			a.forget(h.ID)
		}
		return Sandbox{}, err
	}
	if sb.Name != h.Name || gone(sb.State) {
		a.forget(h.ID)
		return Sandbox{}, fmt.Errorf("sandbox %s is not %q: %w", h.ID, h.Name, adapter.ErrNotFound)
	}
	return sb, nil
}

// forget closes and drops a sandbox's transport.
func (a *Adapter) forget(id string) {
	a.mu.Lock()
	sg := a.guests[id]
	delete(a.guests, id)
	a.mu.Unlock()
	if sg != nil {
		sg.close()
	}
}

// guest returns h's session transport, making it from a GET of the
// sandbox (which names its toolbox proxy): 404 is not_found, a stopped
// sandbox is invalid (suspended), another name is not_found (not this
// incarnation).
func (a *Adapter) guest(ctx context.Context, h adapter.Handle) (*sandboxGuest, error) {
	if h.ID == "" || h.Provider != provider {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("handle %v is not a daytona sandbox", h)}
	}
	a.mu.Lock()
	sg, ok := a.guests[h.ID]
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil, &adapter.InvalidError{Detail: "adapter closed"}
	}
	if ok {
		if sg.name != h.Name {
			return nil, fmt.Errorf("sandbox %s is not %q: %w", h.ID, h.Name, adapter.ErrNotFound)
		}
		return sg, nil
	}
	sb, err := a.sandbox(ctx, h)
	if err != nil {
		return nil, err
	}
	if sb.State != StateStarted {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("sandbox %s is %s", h.ID, sb.State)}
	}
	tb, err := a.cfg.Client.Toolbox(ctx, sb)
	if err != nil {
		return nil, err
	}
	x := &sessionExec{a: a, id: h.ID, tb: tb, perCall: a.perCallSessions}
	gcfg := guest.Config{Provider: provider, Exec: x, Shim: a.cfg.Shim, Root: a.cfg.Root, Version: a.cfg.Version,
		TextSafe: true, Lease: a.cfg.Lease, ReattachWindow: a.cfg.ReattachWindow}
	if a.cfg.ShimBinary != nil {
		gcfg.Install = x.install
	}
	g, err := guest.New(gcfg)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if prev, ok := a.guests[h.ID]; ok {
		a.mu.Unlock()
		g.Close()
		return prev, nil
	}
	if a.closed {
		a.mu.Unlock()
		g.Close()
		return nil, &adapter.InvalidError{Detail: "adapter closed"}
	}
	sg = &sandboxGuest{name: h.Name, g: g, x: x}
	a.guests[h.ID] = sg
	a.mu.Unlock()
	// Once per sandbox and adapter: clear what a dead driver left.
	x.sweep(ctx, time.Now())
	return sg, nil
}

// Exec runs c to completion in the sandbox.
func (a *Adapter) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return adapter.Result{}, err
	}
	return sg.g.Exec(ctx, c)
}

// Spawn starts c as a session once runner-shim acknowledged it.
func (a *Adapter) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return nil, err
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

// Sessions lists the sandbox's sessions in start order.
func (a *Adapter) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return nil, err
	}
	return sg.g.Sessions(ctx)
}

// WriteStdin writes p to session id's stdin (base64, through runner-shim
// write: the toolbox's own input is never used).
func (a *Adapter) WriteStdin(ctx context.Context, h adapter.Handle, id string, p []byte) error {
	sg, err := a.guest(ctx, h)
	if err != nil {
		return err
	}
	return sg.g.WriteStdin(ctx, id, p)
}

// CloseStdin sends session id's stdin a real EOF (runner-shim close-stdin:
// the toolbox has none).
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
