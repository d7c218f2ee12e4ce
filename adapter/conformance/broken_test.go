package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/adapter/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a conformance.T that records instead of failing the real test.
type recorder struct {
	name     string
	mu       sync.Mutex // guards the fields below
	errs     []string
	failed   bool
	skipped  bool
	cleanups []func()
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return r.name }
func (r *recorder) Logf(string, ...any) {
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.mu.Lock()
	r.skipped = true
	r.errs = append(r.errs, "skip: "+fmt.Sprintf(format, args...))
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// run runs one subtest in its own goroutine, as testing does, then its
// cleanups in reverse order.
func run(tc conformance.Test, h conformance.Harness) *recorder {
	r := &recorder{name: tc.Name}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tc.Func(r, h)
	}()
	<-done
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		func() {
			done := make(chan struct{})
			go func() { defer close(done); r.cleanups[i]() }()
			<-done
		}()
	}
	return r
}

func fixtures() conformance.Fixtures {
	fx := conformance.ShellFixtures()
	fx.Probe = func(host string) adapter.Command { return adapter.Command{Path: "probe", Args: []string{host}} }
	fx.ProbeHost = "allowed.example"
	return fx
}

// harness wraps a fresh fake in wrap for every subtest.
func harness(wrap func(*fake.Adapter) adapter.Adapter, opts ...fake.Option) conformance.Harness {
	return conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			f := fake.New(opts...)
			t.Cleanup(func() { _ = f.Close() })
			return conformance.Subject{Adapter: wrap(f), Outage: f.Outage, InterruptList: f.InterruptNextList, CorruptCheckpoint: f.CorruptCheckpoint}
		},
		Fixtures: fixtures(),
		Timeout:  3 * time.Second,
	}
}

// base forwards everything to the fake; each broken adapter overrides one
// behaviour.
type base struct{ *fake.Adapter }

// mapStream forwards st's frames through fn, on a goroutine that ends when
// st's channel closes or the consumer closes the returned stream. Unlike
// adapter.Feed it lets fn emit anything, two terminal frames included.
func mapStream(st adapter.Stream, fn func(adapter.Frame) []adapter.Frame) adapter.Stream {
	s := &rawStream{inner: st, ch: make(chan adapter.Frame, 1), done: make(chan struct{})}
	go func() {
		defer close(s.ch)
		for fr := range st.Frames() {
			for _, out := range fn(fr) {
				select {
				case s.ch <- out:
				case <-s.done:
					for range st.Frames() {
					}
					return
				}
			}
		}
	}()
	return s
}

type rawStream struct {
	inner adapter.Stream
	ch    chan adapter.Frame
	done  chan struct{}
	once  sync.Once
}

func (s *rawStream) SessionID() string            { return s.inner.SessionID() }
func (s *rawStream) Frames() <-chan adapter.Frame { return s.ch }
func (s *rawStream) Close() error {
	s.once.Do(func() {
		close(s.done)
		_ = s.inner.Close()
	})
	return nil
}

func (b base) wrapStreams(st adapter.Stream, err error, fn func(adapter.Frame) []adapter.Frame) (adapter.Stream, error) {
	if err != nil {
		return nil, err
	}
	return mapStream(st, fn), nil
}

// inventsExitZero reports every exit as 0, the Sprites client bug of seed 000.
type inventsExitZero struct{ base }

func zero(f adapter.Frame) []adapter.Frame {
	if f.Exit != nil {
		f.Exit = &adapter.Exit{Code: 0, Reason: adapter.ReasonExited}
	}
	return []adapter.Frame{f}
}

func (b inventsExitZero) Exec(ctx context.Context, h adapter.Handle, c adapter.Command) (adapter.Result, error) {
	r, err := b.base.Exec(ctx, h, c)
	r.Exit = adapter.Exit{Code: 0, Reason: adapter.ReasonExited}
	return r, err
}

func (b inventsExitZero) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, o adapter.SpawnOptions) (adapter.Stream, error) {
	st, err := b.base.Spawn(ctx, h, c, o)
	return b.wrapStreams(st, err, zero)
}

func (b inventsExitZero) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	st, err := b.base.Attach(ctx, h, id, from)
	return b.wrapStreams(st, err, zero)
}

// twoTerminals repeats every terminal frame, but only on new spawns (the
// channel is still closed after the second).
type twoTerminals struct{ base }

func (b twoTerminals) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, o adapter.SpawnOptions) (adapter.Stream, error) {
	st, err := b.base.Spawn(ctx, h, c, o)
	return b.wrapStreams(st, err, func(f adapter.Frame) []adapter.Frame {
		if f.Terminal() {
			return []adapter.Frame{f, f}
		}
		return []adapter.Frame{f}
	})
}

// tailReplay ignores the cursor and replays only the last 8 bytes of each
// stream, as a "last 16 KiB" backend does.
type tailReplay struct{ base }

func (b tailReplay) Attach(ctx context.Context, h adapter.Handle, id string, _ adapter.Cursor) (adapter.Stream, error) {
	infos, err := b.Sessions(ctx, h)
	if err != nil {
		return nil, err
	}
	var from adapter.Cursor
	for _, in := range infos {
		if in.ID == id {
			from = adapter.Cursor{Stdout: max(0, in.Stdout-8), Stderr: max(0, in.Stderr-8)}
		}
	}
	return b.base.Attach(ctx, h, id, from)
}

// notFoundDuringOutage maps every unavailable error to not_found, the
// partition that made nine live sandboxes look absent.
type notFoundDuringOutage struct{ base }

func gone(err error) error {
	if errors.Is(err, adapter.ErrUnavailable) {
		return adapter.ErrNotFound
	}
	return err
}

func (b notFoundDuringOutage) Get(ctx context.Context, name string) (adapter.Handle, error) {
	h, err := b.base.Get(ctx, name)
	return h, gone(err)
}

func (b notFoundDuringOutage) Sessions(ctx context.Context, h adapter.Handle) ([]adapter.SessionInfo, error) {
	s, err := b.base.Sessions(ctx, h)
	return s, gone(err)
}

// shortListing answers a listing it could not complete with what it has.
type shortListing struct{ base }

func (b shortListing) List(ctx context.Context, o adapter.ListOptions) (adapter.Page, error) {
	p, err := b.base.List(ctx, o)
	if err != nil {
		return adapter.Page{}, nil
	}
	return p, nil
}

// eofEveryWrite closes stdin after every write, like a FIFO that each
// write opens and closes.
type eofEveryWrite struct{ base }

func (b eofEveryWrite) WriteStdin(ctx context.Context, h adapter.Handle, id string, p []byte) error {
	if err := b.base.WriteStdin(ctx, h, id, p); err != nil {
		return err
	}
	return b.base.CloseStdin(ctx, h, id)
}

// noopNetworkPolicy advertises network_policy and accepts every policy
// without enforcing it.
type noopNetworkPolicy struct{ base }

func (noopNetworkPolicy) SetNetworkPolicy(context.Context, adapter.Handle, adapter.NetworkPolicy) error {
	return nil
}

func (b noopNetworkPolicy) Create(ctx context.Context, name string, o adapter.CreateOptions) (adapter.Handle, error) {
	return b.base.Create(ctx, name, adapter.CreateOptions{})
}

// pretendsPublicURL does not advertise public_url but guesses a hostname.
type pretendsPublicURL struct{ base }

func (b pretendsPublicURL) Capabilities() adapter.Capabilities {
	return slices.DeleteFunc(b.base.Capabilities(), func(c adapter.Capability) bool { return c == adapter.CapPublicURL })
}

func (pretendsPublicURL) PublicURL(_ context.Context, h adapter.Handle, port int) (string, error) {
	return fmt.Sprintf("https://%d-%s.guessed.example/", port, h.Name), nil
}

// destroysAsTerminate does not advertise terminate_session and destroys
// the sandbox instead.
type destroysAsTerminate struct{ base }

func (b destroysAsTerminate) Capabilities() adapter.Capabilities {
	return slices.DeleteFunc(b.base.Capabilities(), func(c adapter.Capability) bool { return c == adapter.CapTerminateSession })
}

func (b destroysAsTerminate) TerminateSession(ctx context.Context, h adapter.Handle, id string, _ time.Duration) (adapter.Exit, error) {
	if err := b.Destroy(ctx, h); err != nil {
		return adapter.Exit{}, err
	}
	return adapter.Exit{}, adapter.ErrNotSupported
}

// signalAsZero reports a signal death with code 0.
type signalAsZero struct{ base }

func (b signalAsZero) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, o adapter.SpawnOptions) (adapter.Stream, error) {
	st, err := b.base.Spawn(ctx, h, c, o)
	return b.wrapStreams(st, err, func(f adapter.Frame) []adapter.Frame {
		if f.Exit != nil && f.Exit.Signal != "" {
			f.Exit = &adapter.Exit{Code: 0, Signal: f.Exit.Signal, Reason: f.Exit.Reason}
		}
		return []adapter.Frame{f}
	})
}

// neverEnds swallows terminal frames and never closes its streams: the
// timeout wrapper must fail the subtest instead of hanging.
type neverEnds struct{ base }

func (b neverEnds) Spawn(ctx context.Context, h adapter.Handle, c adapter.Command, o adapter.SpawnOptions) (adapter.Stream, error) {
	st, err := b.base.Spawn(ctx, h, c, o)
	if err != nil {
		return nil, err
	}
	f := adapter.NewFeed(st.SessionID(), 1, func() { _ = st.Close() })
	go func() {
		for fr := range st.Frames() {
			if !fr.Terminal() {
				_ = f.Send(context.Background(), fr)
			}
		}
	}()
	return f, nil
}

// lostAsExit reports a session whose sandbox vanished as a clean exit.
type lostAsExit struct{ base }

func (b lostAsExit) Attach(ctx context.Context, h adapter.Handle, id string, from adapter.Cursor) (adapter.Stream, error) {
	st, err := b.base.Attach(ctx, h, id, from)
	return b.wrapStreams(st, err, func(f adapter.Frame) []adapter.Frame {
		if f.Exit != nil && f.Exit.Code == 3 {
			f.Exit = &adapter.Exit{Code: 0, Reason: adapter.ReasonExited}
		}
		return []adapter.Frame{f}
	})
}

// restoreNoop answers Restore of a known checkpoint with success and does
// nothing.
type restoreNoop struct{ base }

func (b restoreNoop) Restore(ctx context.Context, h adapter.Handle, id string) error {
	if strings.HasPrefix(id, "ckpt-") {
		return nil
	}
	return b.base.Restore(ctx, h, id)
}

// restoreOverlays restores the checkpoint's files but keeps files written
// after it (a restore that copies over instead of replacing the disk).
type restoreOverlays struct {
	base
}

func (b restoreOverlays) Restore(ctx context.Context, h adapter.Handle, id string) error {
	if err := b.base.Restore(ctx, h, id); err != nil {
		return err
	}
	_, err := b.base.Exec(ctx, h, adapter.Shell("printf '%s' leftover > conformance-ckpt-new.txt"))
	return err
}

// corruptionIgnored turns the corrupted checkpoint's restore_failed into a
// success, as a restore that never checks what it reads would.
type corruptionIgnored struct{ base }

func (b corruptionIgnored) Restore(ctx context.Context, h adapter.Handle, id string) error {
	var rf *adapter.RestoreFailedError
	if err := b.base.Restore(ctx, h, id); !errors.As(err, &rf) {
		return err
	}
	return nil
}

func TestSuiteCatchesBrokenAdapters(t *testing.T) {
	tests := []struct {
		name     string
		wrap     func(*fake.Adapter) adapter.Adapter
		caughtBy []string // each of these subtests must fail
		timeout  time.Duration
	}{
		{"invents exit 0", func(f *fake.Adapter) adapter.Adapter { return inventsExitZero{base{f}} },
			[]string{"Exec/ExitCode", "Spawn/ExitCode", "Sessions/Detached"}, 0},
		{"two terminal frames", func(f *fake.Adapter) adapter.Adapter { return twoTerminals{base{f}} },
			[]string{"Spawn/OneTerminalFrame"}, 0},
		{"replays only the tail", func(f *fake.Adapter) adapter.Adapter { return tailReplay{base{f}} },
			[]string{"Attach/ReplayCursor"}, 500 * time.Millisecond},
		{"not_found during an outage", func(f *fake.Adapter) adapter.Adapter { return notFoundDuringOutage{base{f}} },
			[]string{"Get/OutageIsNeverNotFound"}, 0},
		{"short listing", func(f *fake.Adapter) adapter.Adapter { return shortListing{base{f}} },
			[]string{"List/InterruptedIsAnError"}, 0},
		{"EOF after every stdin write", func(f *fake.Adapter) adapter.Adapter { return eofEveryWrite{base{f}} },
			[]string{"Stdin/Total", "Attach/ReplayCursor"}, 0},
		{"advertised network policy is a no-op", func(f *fake.Adapter) adapter.Adapter { return noopNetworkPolicy{base{f}} },
			[]string{"Capability/network_policy"}, 0},
		{"public URL not advertised but pretended", func(f *fake.Adapter) adapter.Adapter { return pretendsPublicURL{base{f}} },
			[]string{"Capability/public_url"}, 0},
		{"terminate not advertised, destroys instead", func(f *fake.Adapter) adapter.Adapter { return destroysAsTerminate{base{f}} },
			[]string{"Capability/terminate_session"}, 0},
		{"signal death read as 0", func(f *fake.Adapter) adapter.Adapter { return signalAsZero{base{f}} },
			[]string{"Capability/terminate_session"}, 0},
		{"a rejoin reports a made-up exit", func(f *fake.Adapter) adapter.Adapter { return lostAsExit{base{f}} },
			[]string{"Sessions/Detached"}, 0},
		{"restore answers success but keeps the changed disk", func(f *fake.Adapter) adapter.Adapter { return restoreNoop{base{f}} },
			[]string{"Capability/checkpoint"}, 0},
		{"restore restores only files that still exist", func(f *fake.Adapter) adapter.Adapter { return restoreOverlays{base{f}} },
			[]string{"Capability/checkpoint"}, 0},
		{"a corrupted checkpoint restores anyway", func(f *fake.Adapter) adapter.Adapter { return corruptionIgnored{base{f}} },
			[]string{"Capability/checkpoint"}, 0},
		{"a stream that never ends", func(f *fake.Adapter) adapter.Adapter { return neverEnds{base{f}} },
			[]string{"Spawn/ExitCode"}, 300 * time.Millisecond},
	}
	byName := map[string]conformance.Test{}
	for _, tc := range conformance.Tests() {
		byName[tc.Name] = tc
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := harness(tt.wrap)
			if tt.timeout > 0 {
				h.Timeout = tt.timeout
			}
			for _, name := range tt.caughtBy {
				tc, ok := byName[name]
				if !ok {
					t.Fatalf("no subtest %q", name)
				}
				r := run(tc, h)
				if r.skipped {
					t.Errorf("%s skipped: %v", name, r.errs)
				}
				if !r.failed {
					t.Errorf("%s passed the broken adapter, want it caught", name)
				} else {
					t.Logf("%s caught it: %s", name, strings.Join(r.errs, "; "))
				}
			}
		})
	}
}

// TestSuitePassesTheFake is the other half: the recorder sees no false
// positive against the correct fake, with all and with no capabilities.
func TestSuitePassesTheFake(t *testing.T) {
	for _, opts := range [][]fake.Option{nil, {fake.WithCapabilities()}} {
		h := harness(func(f *fake.Adapter) adapter.Adapter { return f }, opts...)
		for _, tc := range conformance.Tests() {
			r := run(tc, h)
			if r.failed {
				t.Errorf("%s failed against the fake (options %d): %v", tc.Name, len(opts), r.errs)
			}
		}
	}
}

// TestMissingHooksSkipLoudly checks that a harness without hooks or
// fixtures skips with a message that says the requirement went unchecked.
func TestMissingHooksSkipLoudly(t *testing.T) {
	h := harness(func(f *fake.Adapter) adapter.Adapter { return f })
	inner := h.New
	h.New = func(t conformance.T) conformance.Subject {
		s := inner(t)
		s.Outage, s.InterruptList = nil, nil
		return s
	}
	h.Fixtures.Probe = nil
	h.Fixtures.WriteFile = nil
	for _, tc := range conformance.Tests() {
		switch tc.Name {
		case "Get/OutageIsNeverNotFound", "List/InterruptedIsAnError", "Capability/network_policy", "Capability/suspend", "Capability/checkpoint":
			r := run(tc, h)
			if !r.skipped || r.failed || len(r.errs) != 1 || !strings.Contains(r.errs[0], "NOT VERIFIED") {
				t.Errorf("%s: skipped=%v failed=%v messages=%v, want one loud skip", tc.Name, r.skipped, r.failed, r.errs)
			}
		}
	}
}
