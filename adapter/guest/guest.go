package guest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter/guest/guestproto"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/wire"
)

// Executor is a provider's primitive: run a process in the sandbox.
type Executor interface {
	// Exec runs argv (argv[0] looked up in the guest's PATH) with stdin as
	// its stdin (nil: none, at EOF), copies its stdout to stdout as it
	// arrives, and returns its exit status once it ended and stdout was
	// copied. Its stderr may be dropped.
	//
	// lifetime, when positive, bounds the process's life in the guest: a
	// provider that cannot stop a process when ctx ends must have it
	// stopped by then. When ctx ends Exec returns promptly with an error
	// wrapping ctx.Err().
	//
	// A program that does not exist is exit status 127, not an error. An
	// error is a transport failure (the process may or may not have run),
	// in the adapter taxonomy: adapter.ErrNotFound only when the provider
	// definitively says the sandbox is gone, *adapter.UnavailableError
	// for what proves nothing. A process that ended without a reported
	// status is an error wrapping ErrNoStatus.
	Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, lifetime time.Duration) (status int, err error)
}

// ReadStdin reads an Executor's stdin whole, for a provider that sends
// it in one piece, refusing more than max bytes with
// *adapter.InvalidError before any of it is sent: a stdin cut at the
// provider's bound would reach the command short, or half of a write
// would land while the call failed.
func ReadStdin(stdin io.Reader, max int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(stdin, int64(max)+1))
	if err != nil {
		return nil, &adapter.InvalidError{Detail: "read stdin: " + err.Error()}
	}
	if len(b) > max {
		return nil, &adapter.InvalidError{Detail: fmt.Sprintf("stdin over %d bytes", max)}
	}
	return b, nil
}

// ErrNoStatus is wrapped by an Executor's error when the process ended
// but the provider did not report its exit status (Sprites closes some
// execs with a normal closure and no exit frame). stdout then holds what
// arrived: a complete runner-shim answer in it is the call's outcome (the
// answer is printed only once the call took effect), and without one the
// error stands. The status returned with it means nothing.
var ErrNoStatus = errors.New("the provider reported no exit status")

// Defaults of Config.
const (
	DefaultShim      = "runner-shim"
	DefaultRoot      = "/tmp/runner-shim"
	DefaultLease     = 30 * time.Second
	DefaultHeartbeat = 5 * time.Second
	DefaultReattach  = 30 * time.Second
	// callLifetime bounds a one-shot runner-shim call in the guest
	// (terminate adds its grace).
	callLifetime = 60 * time.Second
	// execPruneAge is how long Exec's ended sessions stay in the guest.
	execPruneAge = 10 * time.Minute
	// maxAnswer bounds the stdout read from a one-shot call (a list of
	// many sessions is the largest).
	maxAnswer = 16 << 20
)

// Config describes one sandbox's guest to New.
type Config struct {
	// Provider names the adapter in errors and handles ("e2b").
	Provider string
	// Exec runs processes in the sandbox. Required.
	Exec Executor
	// Shim is runner-shim's path or name in the guest (DefaultShim).
	Shim string
	// Root is runner-shim's session root (DefaultRoot); Exec's sessions
	// live beside it in Root+".exec", so Sessions lists only spawns.
	Root string
	// Version is the runner-shim version the guest must run (the
	// adapter's own build, version.String()). Required: a guest whose
	// shim says another version is refused.
	Version string
	// Install, when not nil, puts the right runner-shim at Shim in the
	// guest; it is called when the guest has none (exit status 127), then
	// the version is verified again. nil: a missing shim is refused.
	Install func(ctx context.Context) error
	// TextSafe reads attaches as base64 lines (runner-shim attach
	// --base64), for an Executor whose stdout is not byte-transparent.
	TextSafe bool
	// Lease bounds each attach process in the guest (DefaultLease); the
	// stream attaches again from its cursors when it ends.
	Lease time.Duration
	// Heartbeat is the attach's heartbeat interval (DefaultHeartbeat).
	Heartbeat time.Duration
	// ReattachWindow is how long a stream keeps attaching again after a
	// cut (DefaultReattach).
	ReattachWindow time.Duration
}

// Guest is the session half of the contract for one sandbox, over its
// Executor. It is safe for concurrent use. The owner must call Close,
// which stops every attach it started (the sessions keep running).
type Guest struct {
	cfg      Config
	execRoot string

	ctx    context.Context // ends on Close: bounds every attach execution
	cancel context.CancelFunc
	wg     sync.WaitGroup // the attach executions

	runMu  sync.Mutex // guards closed, and wg.Add against Close's Wait
	closed bool

	mu       sync.Mutex // guards verified, and serializes verification
	verified bool
}

// New returns the Guest of one sandbox. It does not touch the guest;
// the first call verifies (or installs) runner-shim.
func New(cfg Config) (*Guest, error) {
	if cfg.Exec == nil || cfg.Version == "" {
		return nil, &adapter.InvalidError{Detail: "guest: Config.Exec and Config.Version are required"}
	}
	if cfg.Shim == "" {
		cfg.Shim = DefaultShim
	}
	if cfg.Root == "" {
		cfg.Root = DefaultRoot
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.ReattachWindow <= 0 {
		cfg.ReattachWindow = DefaultReattach
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Guest{cfg: cfg, execRoot: cfg.Root + ".exec", ctx: ctx, cancel: cancel}, nil
}

// Close stops every attach execution this Guest started and waits for
// them. It is idempotent. The guest's sessions keep running.
func (g *Guest) Close() error {
	g.runMu.Lock()
	g.closed = true
	g.runMu.Unlock()
	g.cancel()
	g.wg.Wait()
	return nil
}

// answer is runner-shim's --json answer (the in-guest protocol).
type answer = guestproto.Answer[info]

// info is runner-shim's session object.
type info = guestproto.Info

// errShimMissing is a guest without runner-shim (status 127 and no
// answer).
var errShimMissing = errors.New("runner-shim is not installed in the guest")

// run runs one runner-shim subcommand in root and returns its answer and
// exit status. A transport failure is returned as the Executor said it;
// no JSON answer is errShimMissing (127) or a *ProviderError.
func (g *Guest) run(ctx context.Context, root string, lifetime time.Duration, stdin io.Reader, args ...string) (answer, int, error) {
	argv := append([]string{g.cfg.Shim, "--root", root, "--json"}, args...)
	out := CappedBuffer{Max: maxAnswer}
	status, err := g.cfg.Exec.Exec(ctx, argv, stdin, &out, lifetime)
	if err != nil && !errors.Is(err, ErrNoStatus) {
		return answer{}, status, err
	}
	line := bytes.TrimSpace(out.Bytes())
	if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	var a answer
	if len(line) == 0 || json.Unmarshal(line, &a) != nil {
		if err != nil {
			// No status and no answer: nothing is known.
			return answer{}, status, err
		}
		if status == 127 {
			return answer{}, status, errShimMissing
		}
		return answer{}, status, &adapter.ProviderError{Provider: g.cfg.Provider,
			Detail: fmt.Sprintf("runner-shim %s: exit status %d without an answer (%q)", args[0], status, truncate(string(out.Bytes()), 200))}
	}
	return a, status, nil
}

// call is run after verification, with the answer's error mapped: what
// says which session the call was about.
func (g *Guest) call(ctx context.Context, root, what string, lifetime time.Duration, stdin io.Reader, args ...string) (answer, int, error) {
	if err := g.verify(ctx); err != nil {
		return answer{}, 0, err
	}
	a, status, err := g.run(ctx, root, lifetime, stdin, args...)
	if err != nil {
		if errors.Is(err, errShimMissing) {
			return a, status, &adapter.ProviderError{Provider: g.cfg.Provider, Detail: "runner-shim vanished from the guest"}
		}
		return a, status, err
	}
	if a.Error != nil {
		return a, status, g.answerError(what, &a.Error.Error)
	}
	return a, status, nil
}

// answerError maps a runner-shim JSON error into the taxonomy. The
// guest's shim is the registry of its sessions, so its not_found is
// definitive for a session; the kinds without detail are wrapped with it.
func (g *Guest) answerError(what string, we *wire.Error) error {
	detail := what + ": " + we.Error()
	err, ok := stream.KindError(g.cfg.Provider, we, detail)
	if !ok {
		return &adapter.ProviderError{Provider: g.cfg.Provider, Detail: detail}
	}
	switch err {
	case adapter.ErrNotFound, adapter.ErrTruncated, adapter.ErrNotSupported, adapter.ErrCommandExited, adapter.ErrLost:
		return fmt.Errorf("%s: %w", what, err)
	}
	return err
}

// verify makes sure the guest runs runner-shim of Config.Version, once:
// a missing one is installed (Config.Install) and verified again; a
// mismatch is refused, never used.
func (g *Guest) verify(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.verified {
		return nil
	}
	a, _, err := g.run(ctx, g.cfg.Root, callLifetime, nil, "version")
	if errors.Is(err, errShimMissing) && g.cfg.Install != nil {
		if err := g.cfg.Install(ctx); err != nil {
			return fmt.Errorf("install runner-shim in the guest: %w", err)
		}
		a, _, err = g.run(ctx, g.cfg.Root, callLifetime, nil, "version")
	}
	if errors.Is(err, errShimMissing) {
		return &adapter.ProviderError{Provider: g.cfg.Provider, Detail: fmt.Sprintf("%s not found in the guest: put it in the sandbox's template (images/), or give the adapter an installer", g.cfg.Shim)}
	}
	if err != nil {
		return fmt.Errorf("verify runner-shim in the guest: %w", err)
	}
	if a.Version != g.cfg.Version {
		return &adapter.ProviderError{Provider: g.cfg.Provider,
			Detail: fmt.Sprintf("the guest's runner-shim is version %q, this adapter needs %q: rebuild the sandbox template with the matching runner-shim", a.Version, g.cfg.Version)}
	}
	g.verified = true
	return nil
}

// Verify installs or verifies runner-shim in the guest now (every other
// call does it first, once).
func (g *Guest) Verify(ctx context.Context) error { return g.verify(ctx) }

// spawnArgs are runner-shim spawn's arguments for c.
func spawnArgs(id string, c adapter.Command, tty *adapter.TTYSize, stdinClosed bool) []string {
	args := []string{"spawn", "--id", id}
	if tty != nil {
		args = append(args, "--tty", "--rows", strconv.Itoa(int(tty.Rows)), "--cols", strconv.Itoa(int(tty.Cols)))
	}
	if c.Dir != "" {
		args = append(args, "--cwd", c.Dir)
	}
	for _, kv := range c.Env {
		args = append(args, "--env", kv)
	}
	if stdinClosed {
		// Exec: stdin at EOF, and the exec root kept bounded (sessions
		// ended ten minutes ago are read or abandoned).
		args = append(args, "--stdin-closed", "--prune", execPruneAge.String())
	}
	return append(append(append(args, "--"), c.Path), c.Args...)
}

// checkCommand refuses what runner-shim would refuse, before a round trip.
func checkCommand(c adapter.Command) error {
	if c.Path == "" {
		return &adapter.InvalidError{Detail: "empty command"}
	}
	for _, kv := range c.Env {
		if !strings.Contains(kv, "=") {
			return &adapter.InvalidError{Detail: fmt.Sprintf("env entry %q is not KEY=VALUE", kv)}
		}
	}
	return nil
}

// Spawn starts c as a session and returns once it runs, with its stream
// from byte zero. A retried Spawn with the same opts.SessionID and
// command attaches to the first one's session; another command under
// that id is *InvalidError. A program that cannot start is *InvalidError.
// A transport failure is *UnavailableError, uncertain: retry with the
// same SessionID (mint one first; Spawn does when it is empty).
func (g *Guest) Spawn(ctx context.Context, c adapter.Command, opts adapter.SpawnOptions) (adapter.Stream, error) {
	if err := checkCommand(c); err != nil {
		return nil, err
	}
	id := opts.SessionID
	if id == "" {
		id = NewSessionID()
	}
	if opts.TTY != nil && (opts.TTY.Rows == 0 || opts.TTY.Cols == 0) {
		return nil, &adapter.InvalidError{Detail: "tty size 0"}
	}
	_, _, err := g.call(ctx, g.cfg.Root, "spawn "+id, callLifetime, nil, spawnArgs(id, c, opts.TTY, false)...)
	if err != nil {
		var ue *adapter.UnavailableError
		if errors.As(err, &ue) {
			return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("spawn %s: %s (it may have started: spawn again with the same session id)", id, ue.Detail), Uncertain: true}
		}
		return nil, err
	}
	return g.attach(ctx, g.cfg.Root, id, adapter.Cursor{}, opts.Buffer)
}

// NewSessionID mints a session id runner-shim accepts.
func NewSessionID() string {
	var b [8]byte
	rand.Read(b[:])
	return "s" + hex.EncodeToString(b[:])
}

// Attach rejoins session id from the cursor. It returns ErrNotFound for
// an unknown session, ErrTruncated for a cursor behind the retained
// output and *InvalidError for one beyond a stream's end; the returned
// stream reattaches by itself after cuts and lease ends.
func (g *Guest) Attach(ctx context.Context, id string, from adapter.Cursor) (adapter.Stream, error) {
	if err := g.verify(ctx); err != nil {
		return nil, err
	}
	return g.attach(ctx, g.cfg.Root, id, from, 0)
}

func (g *Guest) attach(ctx context.Context, root, id string, from adapter.Cursor, buffer int) (adapter.Stream, error) {
	first, err := g.dial(ctx, root, id, from)
	if err != nil {
		return nil, err
	}
	dial := func(ctx context.Context, from adapter.Cursor) (stream.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, g.cfg.Lease)
		defer cancel()
		conn, err := g.dial(dctx, root, id, from)
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("attach %s again: no first frame within %v", id, g.cfg.Lease)}
		}
		return conn, err
	}
	return stream.New(id, first, from, dial, stream.Options{Provider: g.cfg.Provider, Buffer: buffer, ReattachWindow: g.cfg.ReattachWindow}), nil
}

// WriteStdin writes p to session id's stdin. A transport failure is
// *UnavailableError, uncertain (the bytes may have arrived).
func (g *Guest) WriteStdin(ctx context.Context, id string, p []byte) error {
	what := "write to session " + id
	var err error
	if len(p) <= 48<<10 {
		_, _, err = g.call(ctx, g.cfg.Root, what, callLifetime, nil, "write", "--base64", id, base64.StdEncoding.EncodeToString(p))
	} else {
		_, _, err = g.call(ctx, g.cfg.Root, what, callLifetime, base64Lines(p), "write", "--base64", id)
	}
	return uncertain(what, err)
}

// CloseStdin sends session id's stdin a real EOF.
func (g *Guest) CloseStdin(ctx context.Context, id string) error {
	_, _, err := g.call(ctx, g.cfg.Root, "close stdin of session "+id, callLifetime, nil, "close-stdin", id)
	return err
}

// Resize sets a TTY session's window size.
func (g *Guest) Resize(ctx context.Context, id string, size adapter.TTYSize) error {
	if size.Rows == 0 || size.Cols == 0 {
		return &adapter.InvalidError{Detail: "tty size 0"}
	}
	_, _, err := g.call(ctx, g.cfg.Root, "resize session "+id, callLifetime, nil, "resize", id, strconv.Itoa(int(size.Rows)), strconv.Itoa(int(size.Cols)))
	return err
}

// Signal sends sig (a name such as "TERM" or "SIGTERM", or a number) to
// session id's process group.
func (g *Guest) Signal(ctx context.Context, id, sig string) error {
	_, _, err := g.call(ctx, g.cfg.Root, "signal session "+id, callLifetime, nil, "signal", id, sig)
	return err
}

// Terminate stops session id (SIGTERM, SIGKILL after grace) and returns
// its exit once recorded; an ended session's recorded exit. A transport
// failure is *UnavailableError, uncertain.
func (g *Guest) Terminate(ctx context.Context, id string, grace time.Duration) (adapter.Exit, error) {
	if err := adapter.CheckGrace(grace); err != nil {
		return adapter.Exit{}, err
	}
	return g.terminate(ctx, g.cfg.Root, id, grace)
}

func (g *Guest) terminate(ctx context.Context, root, id string, grace time.Duration) (adapter.Exit, error) {
	what := "terminate session " + id
	a, _, err := g.call(ctx, root, what, callLifetime+grace, nil, "terminate", "--grace", grace.String(), id)
	if err != nil {
		return adapter.Exit{}, uncertain(what, err)
	}
	if a.Exit == nil {
		return adapter.Exit{}, &adapter.ProviderError{Provider: g.cfg.Provider, Detail: what + ": answer without an exit"}
	}
	return stream.Exit(g.cfg.Provider, id, *a.Exit)
}

// Sessions lists the spawned sessions in start order.
func (g *Guest) Sessions(ctx context.Context) ([]adapter.SessionInfo, error) {
	a, _, err := g.call(ctx, g.cfg.Root, "list sessions", callLifetime, nil, "list")
	if err != nil {
		return nil, err
	}
	out := make([]adapter.SessionInfo, 0, len(a.Sessions))
	for _, s := range a.Sessions {
		in := adapter.SessionInfo{ID: s.ID, TTY: s.TTY, Stdout: s.Stdout, Stderr: s.Stderr, Started: s.StartedAt}
		if len(s.Argv) > 0 {
			in.Command = adapter.Command{Path: s.Argv[0], Args: s.Argv[1:], Dir: s.Cwd}
		}
		switch s.State {
		case "running":
			in.State = adapter.SessionRunning
		case "lost":
			in.State = adapter.SessionLost
		case "exited":
			in.State = adapter.SessionExited
			if s.Exit == nil {
				return nil, &adapter.ProviderError{Provider: g.cfg.Provider, Detail: "session " + s.ID + ": exited without an exit record"}
			}
			ex, err := stream.Exit(g.cfg.Provider, s.ID, *s.Exit)
			if errors.Is(err, adapter.ErrLost) {
				in.State = adapter.SessionLost
				break
			}
			if err != nil {
				return nil, err
			}
			in.Exit = &ex
		default:
			return nil, &adapter.ProviderError{Provider: g.cfg.Provider, Detail: fmt.Sprintf("session %s: unknown state %q", s.ID, s.State)}
		}
		out = append(out, in)
	}
	return out, nil
}

// Exec runs c to completion with its stdin at EOF and returns its output
// and exit. A program that does not exist is exit 127, one that cannot
// be executed 126. When ctx ends first the command is terminated and the
// error wraps ctx.Err().
func (g *Guest) Exec(ctx context.Context, c adapter.Command) (adapter.Result, error) {
	if err := checkCommand(c); err != nil {
		return adapter.Result{}, err
	}
	id := NewSessionID()
	a, status, err := g.call(ctx, g.execRoot, "exec", callLifetime, nil, spawnArgs(id, c, nil, true)...)
	if err != nil {
		if code, ok := execFailure(a, status); ok && errors.Is(err, adapter.ErrInvalid) {
			return adapter.Result{Stderr: []byte(err.Error() + "\n"), Exit: adapter.Exit{Code: code, Reason: adapter.ReasonExited}}, nil
		}
		return adapter.Result{}, err
	}
	st, err := g.attach(ctx, g.execRoot, id, adapter.Cursor{}, 64)
	if err != nil {
		return adapter.Result{}, err
	}
	defer st.Close()
	var r adapter.Result
	for {
		select {
		case <-ctx.Done():
			// Stop it, with a context of its own: ctx is over.
			tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			g.terminate(tctx, g.execRoot, id, 2*time.Second)
			cancel()
			return adapter.Result{}, fmt.Errorf("exec %s: %w", c, ctx.Err())
		case f, ok := <-st.Frames():
			if !ok {
				return adapter.Result{}, &adapter.UnavailableError{Detail: "exec: stream ended without a terminal frame"}
			}
			switch {
			case f.Err != nil:
				return adapter.Result{}, f.Err
			case f.Exit != nil:
				r.Exit = *f.Exit
				return r, nil
			case f.Stream == adapter.Stderr:
				r.Stderr = append(r.Stderr, f.Data...)
			default:
				r.Stdout = append(r.Stdout, f.Data...)
			}
		}
	}
}

// execFailure reports the shell's status for a spawn whose program could
// not start: from the answer's exec_error, else from runner-shim's exit
// status.
func execFailure(a answer, status int) (int, bool) {
	if a.Error != nil {
		switch a.Error.ExecError {
		case guestproto.ExecNotFound:
			return wire.ShimExitExecNotFound, true
		case guestproto.ExecNotExecutable:
			return wire.ShimExitExecNotExecutable, true
		}
	}
	if status == wire.ShimExitExecNotFound || status == wire.ShimExitExecNotExecutable {
		return status, true
	}
	return 0, false
}

// uncertain marks a transport failure of a call that may have taken
// effect.
func uncertain(what string, err error) error {
	var ue *adapter.UnavailableError
	if errors.As(err, &ue) && !ue.Uncertain {
		return &adapter.UnavailableError{Detail: what + ": " + ue.Detail + " (it may have taken effect)", Uncertain: true}
	}
	return err
}

// base64Lines is p as base64 lines of 48 KiB each, runner-shim write
// --base64's stdin.
func base64Lines(p []byte) io.Reader {
	var b bytes.Buffer
	for len(p) > 0 {
		n := min(len(p), 48<<10)
		b.WriteString(base64.StdEncoding.EncodeToString(p[:n]))
		b.WriteByte('\n')
		p = p[n:]
	}
	return &b
}

// CappedBuffer keeps the first Max bytes written to it and drops the
// rest, taking every write whole, so a hostile guest cannot make the
// adapter hold more of a runner-shim answer than Max. An Executor's
// stdout goes into one.
type CappedBuffer struct {
	Max int
	b   bytes.Buffer
}

func (c *CappedBuffer) Write(p []byte) (int, error) {
	if room := c.Max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Bytes returns what was kept.
func (c *CappedBuffer) Bytes() []byte { return c.b.Bytes() }

// Len is len(c.Bytes()).
func (c *CappedBuffer) Len() int { return c.b.Len() }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
