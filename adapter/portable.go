package adapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// Sandboxes is the portable [Adapter] over a [Driver]: every provider
// (runnerd's client, the in-memory fake, each hosted provider) is a
// driver behind it, so the checks and semantics below are written once.
//
//   - names: Create and Get refuse a name the driver cannot accept
//     (*InvalidError) before the driver is asked: a DNS label
//     ([ValidName]) unless the driver is a [NameChecker].
//   - handles: a handle without a name, with a name the driver would
//     refuse, or of another provider, is *InvalidError; the incarnation check is the driver's, in the same
//     step as its act (only its source of truth can say not_found).
//   - capabilities: found once, at New, from the optional interfaces the
//     driver implements (and declares, see [Declarer]); a call behind one
//     that is not advertised is ErrNotSupported before the driver is
//     asked, and a capability is never advertised without its method.
//   - options: an empty command, a zero TTY size, a negative cursor or
//     page size, a grace outside [MinGrace, MaxGrace] and a port outside
//     1-65535 are *InvalidError.
//   - errors: an error the driver returns outside the taxonomy (a driver
//     bug) becomes *ProviderError, still wrapping the original; context
//     errors pass through.
//   - retries: with [Options.Retry], transient failures of the calls the
//     contract calls idempotent (see [WithBackoff]: Create, Get, List,
//     Destroy, Attach, Sessions, Suspend, Resume, SetNetworkPolicy,
//     PublicURL, and Spawn with a SessionID) are retried; the others are
//     made once.
//
// A Sandboxes is safe for concurrent use; it holds no state of its own
// beyond what New found. Close closes the driver when it is an io.Closer.
type Sandboxes struct {
	d     Driver
	name  string
	caps  Capabilities
	retry *Backoff

	names NameChecker
	att   Attacher
	rsz   Resizer
	term  Terminator
	susp  Suspender
	ckpt  Checkpointer
	net   NetworkPolicer
	url   PublicURLer
	fork  Forker
}

var _ Adapter = (*Sandboxes)(nil)

// Options tune [New]. The zero value is usable.
type Options struct {
	// Retry, when not nil, retries the idempotent calls' transient
	// failures with this policy. nil makes every call once.
	Retry *Backoff
}

// New returns the portable adapter over d. It asks d for its optional
// interfaces and, when d is a [Declarer], its capabilities, now and once.
func New(d Driver, opts Options) *Sandboxes {
	s := &Sandboxes{d: d, name: d.Provider(), retry: opts.Retry}
	s.names, _ = d.(NameChecker)
	s.att, _ = d.(Attacher)
	s.rsz, _ = d.(Resizer)
	s.term, _ = d.(Terminator)
	s.susp, _ = d.(Suspender)
	s.ckpt, _ = d.(Checkpointer)
	s.net, _ = d.(NetworkPolicer)
	s.url, _ = d.(PublicURLer)
	s.fork, _ = d.(Forker)
	var declared Capabilities
	dec, dynamic := d.(Declarer)
	if dynamic {
		declared = dec.Capabilities()
	}
	for _, c := range capabilityOf {
		if c.impl(d) && (!dynamic || declared.Has(c.c)) {
			s.caps = append(s.caps, c.c)
		}
	}
	return s
}

// Driver returns the driver s wraps (for a provider package's own
// extensions; callers program against [Adapter]).
func (s *Sandboxes) Driver() Driver { return s.d }

// Close closes the driver when it is an io.Closer; it returns nil
// otherwise.
func (s *Sandboxes) Close() error {
	if c, ok := s.d.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Provider returns the driver's name.
func (s *Sandboxes) Provider() string { return s.name }

// Capabilities returns what New found, in the order of [AllCapabilities].
func (s *Sandboxes) Capabilities() Capabilities { return append(Capabilities(nil), s.caps...) }

// gate refuses a call behind a capability that is not advertised.
func (s *Sandboxes) gate(c Capability, what string) error {
	if s.caps.Has(c) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, ErrNotSupported)
}

func (s *Sandboxes) checkName(name string) error {
	if s.names != nil {
		return s.names.CheckName(name)
	}
	if !ValidName(name) {
		return &InvalidError{Detail: fmt.Sprintf("sandbox name %q is not a DNS label", name)}
	}
	return nil
}

// CheckHandle refuses a handle that names no sandbox, a name the driver
// would refuse (a handle's name goes into provider URLs and paths), or
// another provider's sandbox. A handle with an empty Provider is taken
// as this one's. Every Adapter method runs it; a provider's own exported
// extensions outside the Adapter interface run it too.
func (s *Sandboxes) CheckHandle(h Handle) error {
	if h.Name == "" {
		return &InvalidError{Detail: "zero handle"}
	}
	if h.Provider != "" && h.Provider != s.name {
		return &InvalidError{Detail: fmt.Sprintf("handle of provider %q is not a %s sandbox", h.Provider, s.name)}
	}
	return s.checkName(h.Name)
}

func checkCommand(c Command) error {
	if c.Path == "" {
		return &InvalidError{Detail: "command has no program"}
	}
	return nil
}

func checkSize(size TTYSize) error {
	if size.Rows == 0 || size.Cols == 0 {
		return &InvalidError{Detail: "zero TTY size"}
	}
	return nil
}

// classify returns err unchanged when it is nil, in the taxonomy or a
// context error, and as *ProviderError (wrapping it) otherwise.
func (s *Sandboxes) classify(err error) error {
	if err == nil || KindOf(err) != KindProvider || errors.Is(err, ErrProvider) {
		return err
	}
	return fmt.Errorf("%w: %w", &ProviderError{Provider: s.name, Detail: "unclassified error"}, err)
}

// again runs fn once, or under the retry policy when there is one.
func (s *Sandboxes) again(ctx context.Context, fn func(context.Context) error) error {
	if s.retry == nil {
		return s.classify(fn(ctx))
	}
	return s.classify(WithBackoff(ctx, *s.retry, fn))
}

// Create implements [Adapter.Create].
func (s *Sandboxes) Create(ctx context.Context, name string, opts CreateOptions) (Handle, error) {
	if err := s.checkName(name); err != nil {
		return Handle{}, err
	}
	if opts.NetworkPolicy != nil {
		if err := s.gate(CapNetworkPolicy, "create "+name+" with a network policy"); err != nil {
			return Handle{}, err
		}
	}
	var h Handle
	err := s.again(ctx, func(ctx context.Context) (err error) {
		h, err = s.d.Create(ctx, name, opts)
		return err
	})
	return h, err
}

// Get implements [Adapter.Get].
func (s *Sandboxes) Get(ctx context.Context, name string) (Handle, error) {
	if err := s.checkName(name); err != nil {
		return Handle{}, err
	}
	var h Handle
	err := s.again(ctx, func(ctx context.Context) (err error) {
		h, err = s.d.Get(ctx, name)
		return err
	})
	return h, err
}

// List implements [Adapter.List].
func (s *Sandboxes) List(ctx context.Context, opts ListOptions) (Page, error) {
	if opts.PageSize < 0 {
		return Page{}, &InvalidError{Detail: "negative page size"}
	}
	var p Page
	err := s.again(ctx, func(ctx context.Context) (err error) {
		p, err = s.d.List(ctx, opts)
		return err
	})
	return p, err
}

// Destroy implements [Adapter.Destroy].
func (s *Sandboxes) Destroy(ctx context.Context, h Handle) error {
	if err := s.CheckHandle(h); err != nil {
		return err
	}
	return s.again(ctx, func(ctx context.Context) error { return s.d.Destroy(ctx, h) })
}

// Exec implements [Adapter.Exec]. It is never retried.
func (s *Sandboxes) Exec(ctx context.Context, h Handle, c Command) (Result, error) {
	if err := checkCommand(c); err != nil {
		return Result{}, err
	}
	if err := s.CheckHandle(h); err != nil {
		return Result{}, err
	}
	r, err := s.d.Exec(ctx, h, c)
	return r, s.classify(err)
}

// Spawn implements [Adapter.Spawn]; it is retried only with a SessionID.
func (s *Sandboxes) Spawn(ctx context.Context, h Handle, c Command, opts SpawnOptions) (Stream, error) {
	if err := checkCommand(c); err != nil {
		return nil, err
	}
	if opts.TTY != nil {
		if err := s.gate(CapTTY, "spawn with a TTY"); err != nil {
			return nil, err
		}
		if err := checkSize(*opts.TTY); err != nil {
			return nil, err
		}
	}
	if err := s.CheckHandle(h); err != nil {
		return nil, err
	}
	var st Stream
	call := func(ctx context.Context) (err error) {
		st, err = s.d.Spawn(ctx, h, c, opts)
		return err
	}
	if opts.SessionID == "" {
		return st, s.classify(call(ctx))
	}
	return st, s.again(ctx, call)
}

// Attach implements [Adapter.Attach].
func (s *Sandboxes) Attach(ctx context.Context, h Handle, id string, from Cursor) (Stream, error) {
	if err := s.gate(CapAttach, "attach "+id); err != nil {
		return nil, err
	}
	if from.Stdout < 0 || from.Stderr < 0 {
		return nil, &InvalidError{Detail: "negative cursor"}
	}
	if err := s.CheckHandle(h); err != nil {
		return nil, err
	}
	var st Stream
	err := s.again(ctx, func(ctx context.Context) (err error) {
		st, err = s.att.Attach(ctx, h, id, from)
		return err
	})
	return st, err
}

// Sessions implements [Adapter.Sessions].
func (s *Sandboxes) Sessions(ctx context.Context, h Handle) ([]SessionInfo, error) {
	if err := s.CheckHandle(h); err != nil {
		return nil, err
	}
	var ss []SessionInfo
	err := s.again(ctx, func(ctx context.Context) (err error) {
		ss, err = s.d.Sessions(ctx, h)
		return err
	})
	return ss, err
}

// WriteStdin implements [Adapter.WriteStdin]. It is never retried (a
// transient failure proves nothing about the bytes).
func (s *Sandboxes) WriteStdin(ctx context.Context, h Handle, id string, p []byte) error {
	if err := s.CheckHandle(h); err != nil {
		return err
	}
	return s.classify(s.d.WriteStdin(ctx, h, id, p))
}

// CloseStdin implements [Adapter.CloseStdin]. It is never retried.
func (s *Sandboxes) CloseStdin(ctx context.Context, h Handle, id string) error {
	if err := s.CheckHandle(h); err != nil {
		return err
	}
	return s.classify(s.d.CloseStdin(ctx, h, id))
}

// Resize implements [Adapter.Resize]. It is made once.
func (s *Sandboxes) Resize(ctx context.Context, h Handle, id string, size TTYSize) error {
	if err := s.gate(CapTTY, "resize "+id); err != nil {
		return err
	}
	if err := checkSize(size); err != nil {
		return err
	}
	if err := s.CheckHandle(h); err != nil {
		return err
	}
	return s.classify(s.rsz.Resize(ctx, h, id, size))
}

// TerminateSession implements [Adapter.TerminateSession]. It is made
// once (an uncertain outcome is the caller's to retry, with the same id).
func (s *Sandboxes) TerminateSession(ctx context.Context, h Handle, id string, grace time.Duration) (Exit, error) {
	if err := s.gate(CapTerminateSession, "terminate "+id); err != nil {
		return Exit{}, err
	}
	if err := CheckGrace(grace); err != nil {
		return Exit{}, err
	}
	if err := s.CheckHandle(h); err != nil {
		return Exit{}, err
	}
	e, err := s.term.TerminateSession(ctx, h, id, grace)
	return e, s.classify(err)
}

// Suspend implements [Adapter.Suspend].
func (s *Sandboxes) Suspend(ctx context.Context, h Handle) error {
	return s.onSandbox(ctx, CapSuspend, "suspend", h, func(ctx context.Context) error { return s.susp.Suspend(ctx, h) })
}

// Resume implements [Adapter.Resume].
func (s *Sandboxes) Resume(ctx context.Context, h Handle) error {
	return s.onSandbox(ctx, CapSuspend, "resume", h, func(ctx context.Context) error { return s.susp.Resume(ctx, h) })
}

// Checkpoint implements [Adapter.Checkpoint]. It is never retried (each
// call makes a checkpoint).
func (s *Sandboxes) Checkpoint(ctx context.Context, h Handle) (string, error) {
	if err := s.gate(CapCheckpoint, "checkpoint"); err != nil {
		return "", err
	}
	if err := s.CheckHandle(h); err != nil {
		return "", err
	}
	id, err := s.ckpt.Checkpoint(ctx, h)
	return id, s.classify(err)
}

// Restore implements [Adapter.Restore]. It is made once.
func (s *Sandboxes) Restore(ctx context.Context, h Handle, id string) error {
	if err := s.gate(CapCheckpoint, "restore"); err != nil {
		return err
	}
	if err := s.CheckHandle(h); err != nil {
		return err
	}
	return s.classify(s.ckpt.Restore(ctx, h, id))
}

// SetNetworkPolicy implements [Adapter.SetNetworkPolicy].
func (s *Sandboxes) SetNetworkPolicy(ctx context.Context, h Handle, p NetworkPolicy) error {
	return s.onSandbox(ctx, CapNetworkPolicy, "set network policy", h,
		func(ctx context.Context) error { return s.net.SetNetworkPolicy(ctx, h, p) })
}

// onSandbox gates c, checks h, and makes the idempotent call under the
// retry policy.
func (s *Sandboxes) onSandbox(ctx context.Context, c Capability, what string, h Handle, call func(context.Context) error) error {
	if err := s.gate(c, what); err != nil {
		return err
	}
	if err := s.CheckHandle(h); err != nil {
		return err
	}
	return s.again(ctx, call)
}

// PublicURL implements [Adapter.PublicURL].
func (s *Sandboxes) PublicURL(ctx context.Context, h Handle, port int) (string, error) {
	if err := s.gate(CapPublicURL, "public url"); err != nil {
		return "", err
	}
	if port < 1 || port > 65535 {
		return "", &InvalidError{Detail: fmt.Sprintf("port %d outside 1-65535", port)}
	}
	if err := s.CheckHandle(h); err != nil {
		return "", err
	}
	var u string
	err := s.again(ctx, func(ctx context.Context) (err error) {
		u, err = s.url.PublicURL(ctx, h, port)
		return err
	})
	return u, err
}
