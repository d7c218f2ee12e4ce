package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// T is the part of *testing.T the suite uses. *testing.T satisfies it; a
// recorder that implements it can run [Tests] to check the suite itself.
// Fatalf and Skipf must not return (testing calls runtime.Goexit).
type T interface {
	Helper()
	Name() string
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	Failed() bool
}

var _ T = (*testing.T)(nil)

// Subject is one fresh adapter under test, with its fault hooks.
type Subject struct {
	// Adapter is the adapter under test. The harness releases it (with
	// t.Cleanup) when the subtest ends.
	Adapter adapter.Adapter
	// Outage induces a control-plane outage (the adapter cannot reach its
	// provider: listener stopped, daemon down) until restore is called.
	// nil skips the absence-definitive subtests, loudly.
	Outage func() (restore func())
	// InterruptList makes the next listing be cut mid-response. nil skips
	// the honest-listing interruption subtest, loudly.
	InterruptList func()
	// CorruptCheckpoint damages checkpoint id of the sandbox's stored data
	// (flips bytes of what the provider stores) so that a restore of it
	// must fail restore_failed with the disk unchanged. nil leaves that
	// part of Capability/checkpoint unchecked, loudly.
	CorruptCheckpoint func(h adapter.Handle, id string) error
}

// Harness describes an adapter to the suite, in the manner of go-cloud's
// drivertest: New makes a fresh Subject for every subtest.
type Harness struct {
	// New returns a fresh Subject for one subtest. It fails t on error.
	New func(t T) Subject
	// Fixtures are the adapter's command vocabulary.
	Fixtures Fixtures
	// NewName mints a sandbox name, for adapters whose names must carry a
	// route. nil mints "conf-" plus random hex.
	NewName func(t T) string
	// Timeout bounds each subtest (default 30s). On expiry the subtest
	// fails and its context is canceled, so a hung adapter fails instead
	// of hanging.
	Timeout time.Duration
}

// Fixtures supply commands in the adapter's own vocabulary. [ShellFixtures]
// fills every field but the probe for sandboxes with a POSIX sh.
type Fixtures struct {
	// ExecOK succeeds and prints ExecOKStdout on stdout (seed: echo hello).
	ExecOK       adapter.Command
	ExecOKStdout string
	// ExecFail exits with status 3 (seed: sh -c 'echo oops; exit 3').
	ExecFail adapter.Command
	// SpawnOK prints something and exits 0.
	SpawnOK adapter.Command
	// SpawnStay prints "ready\n", then copies stdin to stdout until EOF
	// and exits 0 (seed: sh -c 'echo ready; cat').
	SpawnStay adapter.Command
	// Stderr prints exactly StderrStdout on stdout and StderrStderr on
	// stderr, each at least two bytes, and exits 0.
	Stderr       adapter.Command
	StderrStdout string
	StderrStderr string
	// WriteFile writes content to path in the sandbox's disk; ReadFile
	// prints it. Used by the suspend and checkpoint subtests; nil skips
	// them when those capabilities are advertised.
	WriteFile func(path, content string) adapter.Command
	ReadFile  func(path string) adapter.Command
	// RemoveFile deletes path (the checkpoint subtest; nil: it overwrites
	// the file instead of deleting it).
	RemoveFile func(path string) adapter.Command
	// Probe exits 0 if and only if the sandbox can reach host. ProbeHost
	// is a host the probe reaches when egress is open or allows it. Needed
	// by adapters that advertise network_policy.
	Probe     func(host string) adapter.Command
	ProbeHost string
}

// ShellFixtures returns the seed's fixtures for sandboxes with a POSIX sh:
// everything but the network probe.
func ShellFixtures() Fixtures {
	return Fixtures{
		ExecOK:       adapter.Shell("echo hello"),
		ExecOKStdout: "hello",
		ExecFail:     adapter.Shell("echo oops; exit 3"),
		SpawnOK:      adapter.Shell("echo hello"),
		SpawnStay:    adapter.Shell("echo ready; cat"),
		Stderr:       adapter.Shell("echo out; echo err >&2; echo more-out; echo more-err >&2"),
		StderrStdout: "out\nmore-out\n",
		StderrStderr: "err\nmore-err\n",
		WriteFile: func(path, content string) adapter.Command {
			return adapter.Shell("printf '%s' " + shellQuote(content) + " > " + shellQuote(path))
		},
		ReadFile:   func(path string) adapter.Command { return adapter.Command{Path: "cat", Args: []string{path}} },
		RemoveFile: func(path string) adapter.Command { return adapter.Command{Path: "rm", Args: []string{path}} },
	}
}

// Test is one subtest of the suite.
type Test struct {
	Name string
	Func func(t T, h Harness)
}

// Run runs every subtest of [Tests] against h, each as t.Run(name).
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("conformance: Harness.New is nil")
	}
	for _, tc := range Tests() {
		t.Run(tc.Name, func(t *testing.T) { tc.Func(t, h) })
	}
}

// env is one subtest's world: its adapter, context and helpers.
type env struct {
	t   T
	h   Harness
	s   Subject
	a   adapter.Adapter
	fx  Fixtures
	ctx context.Context
}

// setup makes the Subject and arms the timeout wrapper.
func setup(t T, h Harness) *env {
	t.Helper()
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex // guards done
	done := false
	timer := time.AfterFunc(timeout, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Errorf("subtest timed out after %v: the adapter hung; canceling its context", timeout)
			cancel()
		}
	})
	t.Cleanup(func() {
		mu.Lock()
		done = true
		mu.Unlock()
		timer.Stop()
		cancel()
	})
	s := h.New(t)
	if s.Adapter == nil {
		t.Fatalf("Harness.New returned no adapter")
	}
	return &env{t: t, h: h, s: s, a: s.Adapter, fx: h.Fixtures, ctx: ctx}
}

var nameSeq struct {
	sync.Mutex
	n int
}

// name mints a sandbox name.
func (e *env) name() string {
	e.t.Helper()
	if e.h.NewName != nil {
		return e.h.NewName(e.t)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	nameSeq.Lock()
	nameSeq.n++
	n := nameSeq.n
	nameSeq.Unlock()
	return fmt.Sprintf("conf-%s-%d", hex.EncodeToString(b), n)
}

// create makes a sandbox that is destroyed when the subtest ends.
func (e *env) create() adapter.Handle {
	e.t.Helper()
	return e.createNamed(e.name(), adapter.CreateOptions{})
}

func (e *env) createNamed(name string, opts adapter.CreateOptions) adapter.Handle {
	e.t.Helper()
	h, err := e.a.Create(e.ctx, name, opts)
	if err != nil {
		e.t.Fatalf("Create(%q) = %v, want a sandbox", name, err)
	}
	e.t.Cleanup(func() { e.destroyQuietly(h) })
	return h
}

func (e *env) destroyQuietly(h adapter.Handle) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.a.Destroy(ctx, h); err != nil {
		e.t.Logf("cleanup: Destroy(%v) = %v", h, err)
	}
}

// exec runs c, failing the subtest on error.
func (e *env) exec(h adapter.Handle, c adapter.Command) adapter.Result {
	e.t.Helper()
	r, err := e.a.Exec(e.ctx, h, c)
	if err != nil {
		e.t.Fatalf("Exec(%v) = %v, want a result", c, err)
	}
	if !r.Exit.Valid() {
		e.t.Errorf("Exec(%v): exit %+v breaks the Exit invariants", c, r.Exit)
	}
	return r
}

// spawn starts c, failing the subtest on error; the stream is read by the
// returned reader and closed when the subtest ends.
func (e *env) spawn(h adapter.Handle, c adapter.Command, opts adapter.SpawnOptions) *reader {
	e.t.Helper()
	st, err := e.a.Spawn(e.ctx, h, c, opts)
	if err != nil {
		e.t.Fatalf("Spawn(%v) = %v, want a stream", c, err)
	}
	if st.SessionID() == "" {
		e.t.Errorf("Spawn(%v): stream has an empty session id", c)
	}
	return e.reader("spawn "+c.String(), st, adapter.Cursor{})
}

// attach rejoins a session, failing the subtest on error.
func (e *env) attach(h adapter.Handle, id string, from adapter.Cursor) *reader {
	e.t.Helper()
	st, err := e.a.Attach(e.ctx, h, id, from)
	if err != nil {
		e.t.Fatalf("Attach(%s, %+v) = %v, want a stream", id, from, err)
	}
	return e.reader(fmt.Sprintf("attach %s from %+v", id, from), st, from)
}

// wantKind reports err unless it is of kind want.
func (e *env) wantKind(call string, err error, want error) {
	e.t.Helper()
	switch {
	case err == nil:
		e.t.Errorf("%s = nil, want %v", call, want)
	case !isKind(err, want):
		e.t.Errorf("%s = %v (kind %s), want %v", call, err, adapter.KindOf(err), want)
	}
}

func isKind(err, want error) bool {
	return adapter.KindOf(err) == adapter.KindOf(want)
}

// requireFiles skips, loudly, when the file fixtures are missing.
func (e *env) requireFiles(what string) {
	e.t.Helper()
	if e.fx.WriteFile == nil || e.fx.ReadFile == nil {
		e.t.Skipf("SKIPPED, NOT VERIFIED: the adapter advertises %s but the harness supplies no WriteFile/ReadFile fixtures", what)
	}
}

func (e *env) writeFile(h adapter.Handle, path, content string) {
	e.t.Helper()
	if r := e.exec(h, e.fx.WriteFile(path, content)); !r.Exit.Success() {
		e.t.Fatalf("WriteFile fixture: exit %v, stderr %q", r.Exit, r.Stderr)
	}
}

func (e *env) readFile(h adapter.Handle, path string) string {
	e.t.Helper()
	r := e.exec(h, e.fx.ReadFile(path))
	if !r.Exit.Success() {
		e.t.Errorf("ReadFile(%s) fixture: exit %v, stderr %q", path, r.Exit, r.Stderr)
	}
	return string(r.Stdout)
}

func quoteAll(b []byte) string {
	const max = 200
	if len(b) > max {
		return fmt.Sprintf("%q...(%d bytes)", b[:max], len(b))
	}
	return fmt.Sprintf("%q", b)
}

func trimNL(s string) string { return strings.TrimRight(s, "\r\n") }

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
