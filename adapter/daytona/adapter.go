package daytona

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
	"github.com/agentrunner/runner/adapter/hosted"
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
	// Config is the runner-shim settings every hosted provider shares
	// (Version is required). Here Shim defaults to "runner-shim", found
	// in the guest's PATH, and holds only [A-Za-z0-9._/+-]; Root defaults
	// to DefaultRoot, Lease to DefaultLease; ShimBinary's binary is
	// uploaded with the toolbox's files API, then made executable with
	// chmod through /process/execute.
	hosted.Config
	// IODir is where each call's script and stdin are uploaded
	// (DefaultIODir). Only [A-Za-z0-9._/+-].
	IODir string
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
	*hosted.Adapter
	cfg AdapterConfig
	// perCallSessions makes executors use a toolbox session per call,
	// deleted on the call's path (set by tests and the benchmark only).
	perCallSessions bool
}

var (
	_ adapter.Adapter   = (*Adapter)(nil)
	_ adapter.Suspender = driver{}
)

// driver is the Daytona half of hosted.Adapter: named sandboxes, toolbox
// sessions.
type driver struct{ a *Adapter }

// NewAdapter returns the adapter for cfg.
func NewAdapter(cfg AdapterConfig) (*Adapter, error) {
	const op = "configure daytona adapter"
	if cfg.Client == nil || cfg.Version == "" {
		return nil, fail(op, 0, invalid("Client and Version are required"))
	}
	if cfg.Shim == "" {
		cfg.Shim = guest.DefaultShim
	}
	if cfg.ShimBinary != nil && !strings.Contains(cfg.Shim, "/") {
		return nil, fail(op, 0, invalid("with ShimBinary, Shim is the path to install it at (a name is looked up in PATH)"))
	}
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if cfg.IODir == "" {
		cfg.IODir = DefaultIODir
	}
	if !plainPath(cfg.Shim) || !plainPath(cfg.IODir) {
		return nil, fail(op, 0, invalid("Shim and IODir may hold only letters, digits and . _ / + -"))
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 25 * time.Millisecond
	}
	a := &Adapter{cfg: cfg}
	h, err := hosted.New(driver{a}, cfg.Config)
	if err != nil {
		return nil, err
	}
	a.Adapter = h
	return a, nil
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

// forget closes and drops a sandbox's transport (its executor deletes its
// idle toolbox sessions).
func (a *Adapter) forget(id string) { a.Forget(id) }

// Provider returns "daytona".
func (driver) Provider() string { return provider }

// Capabilities returns what Daytona plus runner-shim deliver.
func (driver) Capabilities() adapter.Capabilities {
	return adapter.Capabilities{adapter.CapSuspend, adapter.CapAttach, adapter.CapTTY, adapter.CapTerminateSession}
}

func handle(sb Sandbox) adapter.Handle {
	return adapter.Handle{Provider: provider, Name: sb.Name, ID: sb.ID}
}

// gone reports whether a sandbox state means the sandbox is on its way
// out or out: its name is already free.
func gone(state string) bool { return state == StateDestroying || state == StateDestroyed }

// Create creates the sandbox with name; a 409 (the name is taken,
// perhaps by this caller's earlier create whose answer was lost) adopts
// the existing one. It waits for the sandbox to be started; an adopted
// stopped one is returned parked.
func (d driver) Create(ctx context.Context, name string, _ adapter.CreateOptions) (hosted.Created, error) {
	c, cfg := d.a.cfg.Client, d.a.cfg
	req := CreateSandbox{Name: name, Snapshot: cfg.Snapshot, Labels: cfg.Labels, AutoStopInterval: cfg.AutoStopInterval}
	sb, err := c.Create(ctx, req)
	created := err == nil
	if errors.Is(err, ErrNameTaken) {
		sb, err = c.Get(ctx, name)
		if err == nil && sb.Name != name {
			// The name is another sandbox's id (GET takes either).
			if sb, err = d.named(ctx, name); errors.Is(err, adapter.ErrNotFound) {
				err = &adapter.InvalidError{Detail: fmt.Sprintf("the name %q is taken by a sandbox id", name)}
			}
		}
		if err == nil && gone(sb.State) {
			// Deleted, but the name is already free: create again.
			sb, err = c.Create(ctx, req)
			created = err == nil
		}
	}
	if err != nil {
		return hosted.Created{}, err
	}
	if sb.State != StateStarted {
		if sb.State == StateStopped || sb.State == StateStopping {
			// An adopted, parked sandbox: its disk is what was asked for.
			return hosted.Created{Handle: handle(sb), Parked: true}, nil
		}
		if sb, err = c.WaitState(ctx, sb.ID, StateStarted); err != nil {
			if created && errors.Is(err, adapter.ErrProvider) {
				c.Delete(context.WithoutCancel(ctx), sb.ID)
			}
			return hosted.Created{}, err
		}
	}
	return hosted.Created{Handle: handle(sb), New: created}, nil
}

// Discard deletes a sandbox this adapter created whose runner-shim is
// refused (a provider error: it can never work).
func (d driver) Discard(ctx context.Context, h adapter.Handle, err error) {
	if errors.Is(err, adapter.ErrProvider) {
		d.a.forget(h.ID)
		d.a.cfg.Client.Delete(context.WithoutCancel(ctx), h.ID)
	}
}

// Get returns the sandbox named name. Not found is only GET's 404 with the
// API's own body, or a sandbox already being destroyed (its name is free).
func (d driver) Get(ctx context.Context, name string) (adapter.Handle, error) {
	sb, err := d.a.cfg.Client.Get(ctx, name)
	if err == nil && sb.Name != name {
		// GET takes an id or a name, and a name may be another sandbox's
		// id (a UUID is a DNS label): only a complete listing filtered on
		// the name says whether one has it.
		sb, err = d.named(ctx, name)
	}
	if err != nil {
		return adapter.Handle{}, err
	}
	if gone(sb.State) {
		return adapter.Handle{}, adapter.ErrNotFound
	}
	return handle(sb), nil
}

// named returns the sandbox whose name is name from a complete listing;
// not_found when the complete listing has none.
func (d driver) named(ctx context.Context, name string) (Sandbox, error) {
	all, err := d.a.cfg.Client.ListAll(ctx, ListOptions{Name: name, Limit: MaxListLimit})
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
func (d driver) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	limit := opts.PageSize
	if limit <= 0 || limit > MaxListLimit {
		limit = MaxListLimit
	}
	p, err := d.a.cfg.Client.List(ctx, ListOptions{Cursor: opts.PageToken, Limit: limit, Labels: d.a.cfg.Labels})
	if err != nil {
		return adapter.Page{}, err
	}
	out := adapter.Page{NextPageToken: p.NextCursor}
	for _, sb := range p.Items {
		if adapter.ValidName(sb.Name) && !gone(sb.State) {
			out.Handles = append(out.Handles, handle(sb))
		}
	}
	return out, nil
}

// Destroy deletes the sandbox (asynchronously, at Daytona). Absent (a 404
// on delete, confirmed by GET's 404) is success.
func (d driver) Destroy(ctx context.Context, h adapter.Handle) error {
	err := d.a.cfg.Client.Delete(ctx, h.ID)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		if _, gerr := d.a.cfg.Client.Get(ctx, h.ID); errors.Is(gerr, adapter.ErrNotFound) {
			return nil
		}
	}
	return err
}

// Open makes h's transport from a GET of the sandbox (which names its
// toolbox proxy): 404 is not_found, a stopped sandbox is invalid
// (suspended), another name is not_found (not this incarnation).
func (d driver) Open(ctx context.Context, h adapter.Handle) (*hosted.Transport, error) {
	a := d.a
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
	t := &hosted.Transport{Exec: x, TextSafe: true, Close: x.Close,
		// Once per sandbox and adapter: clear what a dead driver left.
		Opened: func(ctx context.Context) { x.sweep(ctx, time.Now()) }}
	if a.cfg.ShimBinary != nil {
		t.Install = x.install
	}
	return t, nil
}

// Suspend makes the driver an adapter.Suspender (CapSuspend).
func (d driver) Suspend(ctx context.Context, h adapter.Handle) error { return d.a.suspend(ctx, h) }

// Resume is Suspend's other half.
func (d driver) Resume(ctx context.Context, h adapter.Handle) error { return d.a.resume(ctx, h) }

// suspend stops the sandbox (Daytona keeps its disk; its processes end)
// and waits until it is stopped. A stopped sandbox is left as it is.
func (a *Adapter) suspend(ctx context.Context, h adapter.Handle) error {
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

// resume starts a stopped sandbox with the disk it had and waits until it
// is started. A started sandbox is left as it is.
func (a *Adapter) resume(ctx context.Context, h adapter.Handle) error {
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
	if h.ID == "" {
		return Sandbox{}, &adapter.InvalidError{Detail: fmt.Sprintf("handle %v names no daytona sandbox id", h)}
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
