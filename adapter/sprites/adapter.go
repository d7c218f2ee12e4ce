package sprites

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
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
	// after. The sessions runner-shim spawns are not the call's process:
	// they live on.
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
// them). Not advertised: suspend (the API has no suspend call: a sprite
// goes cold by itself and wakes on any call), network_policy (Sprites'
// policy is DNS-based and fails open in known cases; the stand-in stores
// it without enforcing it, so the egress probe has never passed against
// it), public_url (a sprite's URL is its name, one per sprite, not an
// unguessable per-port token), checkpoint.
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
	return adapter.Capabilities{adapter.CapAttach, adapter.CapTTY, adapter.CapTerminateSession}
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

// shimExec is guest.Executor over the exec WebSocket of one sprite
// incarnation.
type shimExec struct {
	a        *Adapter
	name, id string
}

// idempotentCalls are the runner-shim subcommands that may run again when
// their answer was lost: running them twice gives the answer of once.
// spawn is one because adapter/guest always passes --id (a retried spawn
// of the same request answers the first one's session); write and signal
// are not.
var idempotentCalls = map[string]bool{
	"version": true, "spawn": true, "list": true, "status": true,
	"close-stdin": true, "resize": true, "terminate": true,
}

// oneShot returns the subcommand of a runner-shim --json call (adapter/
// guest's argv: shim --root R --json SUB …), or "" for a streamed call
// (attach), whose output goes through as it arrives.
func oneShot(argv []string) string {
	if len(argv) > 4 && argv[3] == "--json" {
		return argv[4]
	}
	return ""
}

// Exec implements guest.Executor. The exit status comes from the exit
// frame when Sprites sends one. When it does not ([ErrNoExit]), the error
// wraps guest.ErrNoStatus and runner-shim's answer, if it arrived, is the
// outcome; a one-shot call whose answer did not arrive is run again when
// it is idempotent. A one-shot call's stdout is held until the call ends,
// so a second run never mixes with the first.
func (x *shimExec) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, lifetime time.Duration) (int, error) {
	argv, stdin = dataOffArgv(argv, stdin)
	var in []byte
	if stdin != nil {
		b, err := io.ReadAll(io.LimitReader(stdin, maxCallStdin+1))
		if err != nil {
			return 0, &adapter.InvalidError{Detail: "read stdin: " + err.Error()}
		}
		if len(b) > maxCallStdin {
			return 0, &adapter.InvalidError{Detail: fmt.Sprintf("stdin of one call exceeds %d bytes", maxCallStdin)}
		}
		in = b
	}
	if lifetime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lifetime)
		defer cancel()
	}
	call := oneShot(argv)
	if call == "spawn" && x.a.cfg.TaskSocket != "" {
		argv = append(append(argv[:5:5], "--hold-task", x.a.cfg.TaskSocket), argv[5:]...)
	}
	if call == "" {
		// A streamed call (attach, read-only) whose exec delivered not
		// one byte lost its whole output (sprites-py #16; runner-shim's
		// attach always writes a frame): it proved nothing, so it runs
		// again, whether its exit came or not (a missing runner-shim,
		// 127, aside). Once a byte went through, the stream's own decoder
		// judges a cut.
		for attempt := 1; ; attempt++ {
			cw := &counting{w: stdout}
			status, err := x.run(ctx, argv, in, stdin != nil, cw)
			lost := cw.n == 0 && (errors.Is(err, ErrNoExit) || err == nil && status != 127)
			if lost && attempt < maxCallAttempts && ctx.Err() == nil {
				continue
			}
			if errors.Is(err, ErrNoExit) {
				return -1, fmt.Errorf("%w: %w", guest.ErrNoStatus, err)
			}
			if err != nil {
				return status, x.confirm(ctx, err)
			}
			return status, nil
		}
	}
	for attempt := 1; ; attempt++ {
		out := &capped{max: maxCallAnswer}
		status, err := x.run(ctx, argv, in, stdin != nil, out)
		ans := answerOf(out.b.Bytes())
		switch {
		case err != nil && !errors.Is(err, ErrNoExit):
			return status, x.confirm(ctx, err)
		case ans != nil:
			// Only up to the answer: stderr merged after it (a replayed
			// fast command) is not runner-shim's answer.
			if _, werr := stdout.Write(ans); werr != nil {
				return -1, werr
			}
			if err != nil {
				return -1, fmt.Errorf("%w: %w", guest.ErrNoStatus, err)
			}
			return status, nil
		case err == nil && status == 127 && out.b.Len() == 0:
			// No runner-shim at the path (the stand-in's status, as a
			// shell's; see docs/providers/sprites.md): adapter/guest
			// installs it.
			return status, nil
		case err == nil:
			// runner-shim --json always answers, so an exit without an
			// answer lost its output (sprites-py #16, a replay cut at
			// 64 KiB): as unknown as a missing exit frame.
			err = &Error{Op: "runner-shim " + call, kind: &adapter.UnavailableError{
				Detail: fmt.Sprintf("exit status %d came without runner-shim's answer (%d bytes of output)", status, out.b.Len()), Uncertain: true}, cause: ErrNoExit}
		}
		if !idempotentCalls[call] || attempt == maxCallAttempts || ctx.Err() != nil {
			return -1, x.confirm(ctx, err)
		}
	}
}

// dataOffArgv moves the bytes of a `write --base64 ID B64` from argv to
// stdin (one base64 line, which runner-shim reads the same way): an exec's
// argv travels in the WebSocket URL's query, where stdin bytes (a secret
// piped to an agent) must never go and where 64 KiB of base64 would
// overflow URL limits of the proxies on the way.
func dataOffArgv(argv []string, stdin io.Reader) ([]string, io.Reader) {
	if stdin != nil || oneShot(argv) != "write" || len(argv) != 8 || argv[5] != "--base64" {
		return argv, stdin
	}
	return argv[:7:7], strings.NewReader(argv[7] + "\n")
}

// answerOf returns b up to the end of its last line that is one whole
// JSON object (runner-shim's one-line answer, printed only once the call
// took effect), or nil when no line is. What follows that line is not
// stdout's: a replayed fast command has its stderr merged in after it.
func answerOf(b []byte) []byte {
	end := len(b)
	for end > 0 {
		start := bytes.LastIndexByte(b[:end], '\n') + 1
		line := bytes.TrimSpace(b[start:end])
		if len(line) > 0 && line[0] == '{' && json.Valid(line) {
			return b[:end]
		}
		end = max(start-1, 0)
	}
	return nil
}

// run is one exec: stdin (when given) written beside the reader and then
// closed, stdout copied as it arrives, stderr dropped.
func (x *shimExec) run(ctx context.Context, argv []string, in []byte, withStdin bool, stdout io.Writer) (int, error) {
	s, err := x.a.cfg.Client.Exec(ctx, x.name, ExecOptions{Argv: argv, Stdin: withStdin, MaxRunAfterDisconnect: disconnectGrace})
	if err != nil {
		return 0, err
	}
	// The writer's owner is this call: Close unblocks it, Wait collects it.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer s.Close()
	if withStdin {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.WriteStdin(ctx, in) == nil {
				_ = s.CloseStdin(ctx)
			}
		}()
	}
	for {
		ev, err := s.Recv(ctx)
		if err != nil {
			return -1, err
		}
		switch ev.Kind {
		case EventStdout:
			if _, err := stdout.Write(ev.Data); err != nil {
				// The reader (an attach's consumer) went away.
				return -1, fmt.Errorf("copy stdout: %w", context.Canceled)
			}
		case EventExit:
			return ev.ExitCode, nil
		}
	}
}

// confirm judges a failed call: one that proves nothing is followed by a
// GET of the sprite, whose 404 (or another incarnation under the name)
// makes it not_found. Anything else stays what it was.
func (x *shimExec) confirm(ctx context.Context, err error) error {
	if ctx.Err() != nil || !(errors.Is(err, adapter.ErrUnavailable) || errors.Is(err, adapter.ErrProvider)) {
		return err
	}
	sp, gerr := x.a.cfg.Client.Get(ctx, x.name)
	switch {
	case errors.Is(gerr, adapter.ErrNotFound):
		x.a.forget(x.id)
		return fmt.Errorf("sprite %s: %w", x.name, adapter.ErrNotFound)
	case gerr == nil && sp.ID != x.id:
		x.a.forget(x.id)
		return fmt.Errorf("sprite %s is now %s, not %s: %w", x.name, sp.ID, x.id, adapter.ErrNotFound)
	}
	return err
}

// install uploads runner-shim to the configured path with fs/write, mode
// 0755, parents created (guest.Config.Install, and Create of a new
// sprite).
func (x *shimExec) install(ctx context.Context) error {
	b, err := x.a.cfg.ShimBinary()
	if err != nil {
		return &adapter.ProviderError{Provider: provider, Detail: "read the runner-shim binary: " + err.Error()}
	}
	if _, err := x.a.cfg.Client.WriteFile(ctx, x.name, x.a.cfg.Shim, b, 0o755); err != nil {
		return x.confirm(ctx, err)
	}
	return nil
}

// counting counts what goes through to w.
type counting struct {
	w io.Writer
	n int64
}

func (c *counting) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// capped keeps the first max bytes written to it and drops the rest.
type capped struct {
	b   bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
