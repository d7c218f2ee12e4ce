package e2b

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
	"github.com/agentrunner/runner/adapter/hosted"
)

// NameKey is the sandbox metadata key that holds the caller's name: E2B
// mints sandbox ids, so a name lives in metadata and Create adopts the
// sandbox a listing shows under it.
const NameKey = "runner-name"

// DefaultRoot is runner-shim's session root in the guest, relative to
// the working directory envd gives processes (the sandbox user's home).
const DefaultRoot = ".runner-shim"

// AdapterConfig configures the contract adapter, NewAdapter.
type AdapterConfig struct {
	// Client is the control-plane client. Required.
	Client *Client
	// Template is the template every sandbox is created from: one with
	// runner-shim of Version in it (images/e2b). Required.
	Template string
	// Timeout is each sandbox's time to live in seconds (0: the API's
	// default, DefaultTimeout). Sandboxes are created with autoPause, so
	// a time to live that runs out pauses the sandbox, memory, processes
	// and disk kept; it is never not_found for it, and its next use
	// resumes it (TestLeftAlonePastTheTimeToLive). While the adapter holds
	// a call or a stream into a sandbox it renews the time to live every
	// third of it (TestAttachLongerThanTheTimeToLive).
	Timeout int32
	// Config is the runner-shim settings every hosted provider shares
	// (Version is required). Here Shim defaults to "runner-shim", found
	// in the guest's PATH, Root to DefaultRoot, and ShimBinary's binary is
	// written with envd's files API, then made executable.
	hosted.Config
	// Logger receives the lease's renewals and resumes (nil: discarded).
	// No secret reaches it.
	Logger *slog.Logger
}

// Adapter is the contract (adapter.Adapter) over E2B: the control plane
// for sandboxes, and runner-shim in each sandbox, driven through envd's
// process API by adapter/guest, for sessions. It is safe for concurrent
// use; the owner must call Close.
//
// Sandboxes are created with secure: true (envd then requires the access
// token the control plane gives, sent only as X-Access-Token) and
// autoPause: true (an expiry pauses, never kills; see
// AdapterConfig.Timeout). A sandbox paused behind the adapter (E2B's
// pause call, another client) is resumed by its next use, which runs
// (TestPausedIsNeverNotFound). Destroy kills the sandbox and every
// session in it (TestSandboxGone).
//
// Capabilities: attach, tty and terminate_session (runner-shim delivers
// them). Not advertised: suspend (the contract's Suspend ends the
// sandbox's processes, while E2B's pause freezes them and resume
// continues them; what the adapter does with pause is keep sessions
// across an expiry, TestLeftAlonePastTheTimeToLive), network_policy
// (E2B's egress switch leaves DNS open), public_url, checkpoint.
type Adapter struct {
	*hosted.Adapter
	cfg AdapterConfig

	leases    *leases
	closeOnce sync.Once
}

var _ adapter.Adapter = (*Adapter)(nil)

// driver is the E2B half of hosted.Adapter: names in metadata, envd.
type driver struct{ a *Adapter }

// NewAdapter returns the adapter for cfg.
func NewAdapter(cfg AdapterConfig) (*Adapter, error) {
	if cfg.Client == nil || cfg.Template == "" || cfg.Version == "" {
		return nil, fail("configure e2b adapter", 0, invalid("Client, Template and Version are required"))
	}
	if cfg.Shim == "" {
		cfg.Shim = guest.DefaultShim
	}
	if cfg.ShimBinary != nil && !strings.Contains(cfg.Shim, "/") {
		return nil, fail("configure e2b adapter", 0, invalid("with ShimBinary, Shim is the path to install it at (a name is looked up in PATH)"))
	}
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if cfg.Timeout < 0 {
		return nil, fail("configure e2b adapter", 0, invalid("Timeout must not be negative"))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Adapter{cfg: cfg, leases: newLeases(cfg.Client, log)}
	h, err := hosted.New(driver{a}, cfg.Config)
	if err != nil {
		return nil, err
	}
	a.Adapter = h
	return a, nil
}

// ttl is the time to live the adapter asks for.
func (a *Adapter) ttl() time.Duration {
	if a.cfg.Timeout > 0 {
		return time.Duration(a.cfg.Timeout) * time.Second
	}
	return DefaultTimeout
}

// Close stops every attach this adapter runs and the lease keeper, and
// waits for them (sessions and sandboxes keep running, until their time
// to live pauses them). It is idempotent.
func (a *Adapter) Close() error {
	a.Adapter.Close()
	a.closeOnce.Do(a.leases.close)
	return nil
}

// forget closes and drops a sandbox's transport and lease.
func (a *Adapter) forget(id string) { a.Forget(id) }

// Provider returns "e2b".
func (driver) Provider() string { return provider }

// Capabilities returns what E2B plus runner-shim deliver.
func (driver) Capabilities() adapter.Capabilities {
	return adapter.Capabilities{adapter.CapAttach, adapter.CapTTY, adapter.CapTerminateSession}
}

func handle(sb Sandbox) adapter.Handle {
	return adapter.Handle{Provider: provider, Name: sb.Metadata[NameKey], ID: sb.SandboxID}
}

// find returns the sandbox named name: the oldest (start time, then id)
// of a complete listing filtered on the name, so every creator that
// raced agrees on one. ok is false when the complete listing has none.
func (d driver) find(ctx context.Context, name string) (Sandbox, bool, error) {
	all, err := d.a.cfg.Client.ListAll(ctx, ListOptions{Metadata: map[string]string{NameKey: name}})
	if err != nil {
		return Sandbox{}, false, err
	}
	all = slices.DeleteFunc(all, func(sb Sandbox) bool { return sb.Metadata[NameKey] != name })
	if len(all) == 0 {
		return Sandbox{}, false, nil
	}
	return slices.MinFunc(all, func(x, y Sandbox) int {
		if c := x.StartedAt.Compare(y.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(x.SandboxID, y.SandboxID)
	}), true, nil
}

// Create returns the sandbox named name, creating it from the template
// when a complete listing shows none. Creates that raced across
// processes converge on the oldest sandbox, and the others delete the
// one they made.
func (d driver) Create(ctx context.Context, name string, _ adapter.CreateOptions) (hosted.Created, error) {
	c := d.a.cfg.Client
	sb, ok, err := d.find(ctx, name)
	if err != nil {
		return hosted.Created{}, err
	}
	created := false
	if !ok {
		mine, err := c.Create(ctx, NewSandbox{TemplateID: d.a.cfg.Template, Timeout: d.a.cfg.Timeout,
			AutoPause: true, Secure: true, Metadata: map[string]string{NameKey: name}})
		if err != nil {
			return hosted.Created{}, err
		}
		sb, ok, err = d.find(ctx, name)
		switch {
		case err != nil || !ok:
			// Ours exists; the listing failed or lags: ours it is.
			sb = mine
			created = true
		case sb.SandboxID != mine.SandboxID:
			// Another creator won the race: ours goes.
			c.Delete(ctx, mine.SandboxID)
		default:
			created = true
		}
	}
	h := handle(sb)
	h.Name = name
	return hosted.Created{Handle: h, New: created}, nil
}

// Discard deletes a sandbox this adapter created whose runner-shim is
// refused (a provider error: it can never work).
func (d driver) Discard(ctx context.Context, h adapter.Handle, err error) {
	if errors.Is(err, adapter.ErrProvider) {
		d.a.forget(h.ID)
		d.a.cfg.Client.Delete(context.WithoutCancel(ctx), h.ID)
	}
}

// Get returns the sandbox named name. Not found means a complete listing
// has no sandbox of that name and none was confirmed by GET; every other
// failure proves nothing.
func (d driver) Get(ctx context.Context, name string) (adapter.Handle, error) {
	sb, ok, err := d.find(ctx, name)
	if err != nil {
		return adapter.Handle{}, err
	}
	if !ok {
		return adapter.Handle{}, adapter.ErrNotFound
	}
	// Confirm with GET: only its 404 says the listed one is gone.
	if _, err := d.a.cfg.Client.Get(ctx, sb.SandboxID); err != nil {
		return adapter.Handle{}, err
	}
	return handle(sb), nil
}

// List returns one page of the sandboxes this adapter named (those with
// NameKey); E2B's own cursor is the page token.
func (d driver) List(ctx context.Context, opts adapter.ListOptions) (adapter.Page, error) {
	limit := opts.PageSize
	if limit <= 0 || limit > 100 {
		limit = 100
	}
	p, err := d.a.cfg.Client.List(ctx, ListOptions{NextToken: opts.PageToken, Limit: limit})
	if err != nil {
		return adapter.Page{}, err
	}
	out := adapter.Page{NextPageToken: p.NextToken}
	for _, sb := range p.Sandboxes {
		if adapter.ValidName(sb.Metadata[NameKey]) {
			out.Handles = append(out.Handles, handle(sb))
		}
	}
	return out, nil
}

// Destroy deletes the sandbox. Absent (E2B's 404 on delete, confirmed by
// GET's 404) is success.
func (d driver) Destroy(ctx context.Context, h adapter.Handle) error {
	err := d.a.cfg.Client.Delete(ctx, h.ID)
	var e *Error
	if errors.As(err, &e) && e.Status == 404 {
		if _, gerr := d.a.cfg.Client.Get(ctx, h.ID); errors.Is(gerr, adapter.ErrNotFound) {
			return nil
		}
	}
	return err
}

// Open makes h's transport from a GET of the sandbox (which gives envd's
// token): 404 is not_found, another name is not_found (not this
// incarnation); a paused sandbox is never not_found: its first use
// resumes it (leases.acquire).
func (d driver) Open(ctx context.Context, h adapter.Handle) (*hosted.Transport, error) {
	a := d.a
	sb, err := a.cfg.Client.Get(ctx, h.ID)
	if err != nil {
		return nil, err
	}
	if sb.Metadata[NameKey] != h.Name {
		return nil, fmt.Errorf("sandbox %s is not %q: %w", h.ID, h.Name, adapter.ErrNotFound)
	}
	// A paused sandbox is resumed by the lease on first use (its renewal
	// time is unknown yet, so the first use connects).
	ttl := sandboxTTL(a.ttl(), sb)
	x := &envdExec{a: a, id: h.ID}
	x.envd.Store(a.cfg.Client.Envd(sb))
	t := &hosted.Transport{Exec: x,
		Opened: func(context.Context) {
			a.leases.add(h.ID, ttl, time.Time{}, func(sb Sandbox) { x.envd.Store(a.cfg.Client.Envd(sb)) })
		},
		Close: func() { a.leases.remove(h.ID) }}
	if a.cfg.ShimBinary != nil {
		t.Install = x.install
	}
	return t, nil
}

// envdExec is guest.Executor over envd's process API.
type envdExec struct {
	a    *Adapter
	id   string
	envd atomic.Pointer[Envd] // replaced when a connect answers a token
}

// maxStdin bounds an Exec's stdin, read whole before the process starts
// and sent in 1 MiB SendInput calls.
const maxStdin = 64 << 20

// execShell runs argv through sh so that a missing program is status
// 127 and one that cannot run 126, as guest.Executor says, rather than a
// start error envd words differently by version.
const execShell = `exec "$0" "$@"`

// Exec implements guest.Executor: envd's Start (acknowledged), stdin
// through SendInput and CloseStdin, stdout copied as it arrives (stderr
// dropped), the exit code from the end event. envd keeps a process whose
// stream ends, so lifetime goes as Connect-Timeout-Ms.
func (x *envdExec) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, lifetime time.Duration) (int, error) {
	// Every call and every stream is one of these: the lease keeps the
	// sandbox's time to live running while any is in flight.
	defer x.a.leases.acquire(ctx, x.id)()
	withStdin := stdin != nil
	var in []byte
	if withStdin {
		b, err := guest.ReadStdin(stdin, maxStdin)
		if err != nil {
			return 0, err
		}
		in = b
	}
	req := StartRequest{Process: ProcessConfig{Cmd: "/bin/sh", Args: append([]string{"-c", execShell}, argv...)},
		Stdin: &withStdin, Lifetime: lifetime}
	st, err := x.envd.Load().Start(ctx, req)
	if err != nil {
		var resumed bool
		if err, resumed = x.judge(ctx, err); resumed && proxyAnswered(err) {
			// The edge proxy answered for a paused sandbox: envd never saw
			// the request, so it is started once more, resumed.
			st, err = x.envd.Load().Start(ctx, req)
			if err != nil {
				err, _ = x.judge(ctx, err)
			}
		}
		if err != nil {
			return 0, err
		}
	}
	defer st.Close()
	if withStdin {
		sel := Selector{PID: st.PID()}
		envd := x.envd.Load()
		for b := in; len(b) > 0; {
			n := min(len(b), 1<<20)
			if err := envd.SendInput(ctx, sel, b[:n], false); err != nil {
				return 0, x.confirm(ctx, err)
			}
			b = b[n:]
		}
		if err := envd.CloseStdin(ctx, sel); err != nil {
			return 0, x.confirm(ctx, err)
		}
	}
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return 0, &adapter.UnavailableError{Detail: fmt.Sprintf("envd: %s ended without an end event", argv[0])}
		}
		if err != nil {
			return 0, x.confirm(ctx, err)
		}
		if len(ev.Stdout) > 0 {
			if _, err := stdout.Write(ev.Stdout); err != nil {
				return 0, fmt.Errorf("copy stdout: %w", context.Canceled)
			}
		}
		if ev.End != nil {
			if !ev.End.Exited {
				return 0, &adapter.UnavailableError{Detail: fmt.Sprintf("envd: %s ended by %s", argv[0], ev.End.Status)}
			}
			return int(ev.End.ExitCode), nil
		}
	}
}

// confirm judges an envd failure (judge).
func (x *envdExec) confirm(ctx context.Context, err error) error {
	err, _ = x.judge(ctx, err)
	return err
}

// judge judges an envd failure: one that proves nothing is checked with
// a GET of the sandbox, whose 404 is the only not_found. A paused
// sandbox (paused behind the adapter's lease) is resumed and the failure
// stays unavailable, retryable; resumed reports it. Anything else stays
// what it was.
func (x *envdExec) judge(ctx context.Context, err error) (_ error, resumed bool) {
	if ctx.Err() != nil || !errors.Is(err, adapter.ErrUnavailable) {
		return err, false
	}
	sb, gerr := x.a.cfg.Client.Get(ctx, x.id)
	switch {
	case errors.Is(gerr, adapter.ErrNotFound):
		x.a.forget(x.id)
		return fmt.Errorf("sandbox %s: %w", x.id, adapter.ErrNotFound), false
	case gerr == nil && sb.State == StatePaused:
		if !x.a.leases.resume(ctx, x.id) {
			return fmt.Errorf("sandbox %s is paused and did not resume: %w", x.id, err), false
		}
		return fmt.Errorf("sandbox %s was paused, now resumed: %w", x.id, err), true
	}
	return err, false
}

// proxyAnswered reports an envd failure that E2B's edge proxy answered
// (an HTTP status without a Connect error body): envd never received the
// request.
func proxyAnswered(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusBadGateway && e.Code == ""
}

// asUnavailable keeps an error that is not a sandbox's definitive
// absence from reading as one: only GET's 404 is not_found.
func asUnavailable(err error) error {
	if errors.Is(err, adapter.ErrNotFound) {
		return &adapter.UnavailableError{Detail: err.Error()}
	}
	return err
}

// install writes the runner-shim binary at the configured path with
// envd's files API and makes it executable (envd sets no modes).
func (x *envdExec) install(ctx context.Context) error {
	b, err := x.a.cfg.ShimBinary()
	if err != nil {
		return fmt.Errorf("read runner-shim binary: %w", err)
	}
	if err := x.envd.Load().WriteFile(ctx, x.a.cfg.Shim, bytes.NewReader(b)); err != nil {
		return x.confirm(ctx, err)
	}
	status, err := x.Exec(ctx, []string{"chmod", "0755", x.a.cfg.Shim}, nil, io.Discard, time.Minute)
	if err != nil {
		return err
	}
	if status != 0 {
		return &adapter.ProviderError{Provider: provider, Detail: fmt.Sprintf("chmod runner-shim in the guest: exit status %d", status)}
	}
	return nil
}
