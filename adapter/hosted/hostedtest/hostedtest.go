// Package hostedtest holds the provider scenarios every hosted adapter
// (adapter/hosted's drivers) must pass against its stand-in, beyond the
// provider-neutral conformance suite: a driver killed mid-attach, a
// sandbox deleted behind the adapter's back, a rate limit and an outage.
// Each provider's tests call them with a [Subject] made over its
// stand-in, as go-cloud's drivertest runs one suite over every driver.
//
// Invariants: hostedtest imports only the standard library, adapter and
// adapter/conformance;
// a scenario ends only processes it started, and only through the
// adapter; every check reads got X, want Y.
package hostedtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// Adapter is a hosted adapter the scenario can close (a driver's death).
type Adapter interface {
	adapter.Adapter
	Close() error
}

// Subject is one provider's adapters over one stand-in.
type Subject struct {
	// New returns a fresh adapter over the stand-in, closed at t's cleanup.
	New func(t testing.TB) Adapter
	// Dir returns the stand-in's host directory that is the working
	// directory of h's commands.
	Dir func(h adapter.Handle) string
	// RateLimit answers the next n API requests 429 with Retry-After.
	RateLimit func(n int, retryAfter time.Duration)
	// Outage makes every provider endpoint fail (503, dropped
	// connections) until the returned func is called.
	Outage func() (restore func())
	// InterruptList cuts the body of the next list answer midway.
	InterruptList func()
	// CorruptCheckpoint damages checkpoint id of h as the stand-in
	// stores it (conformance.Subject.CorruptCheckpoint); nil where the
	// provider has no checkpoints.
	CorruptCheckpoint func(h adapter.Handle, id string) error
}

// DriverKilledMidAttach: the driver (its adapter) dies while it reads a
// session that streams 3 MB of random bytes; a new adapter attaches from
// the cursor it had and the two reads are the session's bytes exactly.
func DriverKilledMidAttach(t *testing.T, s Subject) {
	ctx := Ctx(t)
	a1 := s.New(t)
	h, err := a1.Create(ctx, "killed-driver", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := a1.Spawn(ctx, h, adapter.Shell(`head -c 3000000 /dev/urandom > data; echo ready; read go; cat data`), adapter.SpawnOptions{SessionID: "big"})
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for !strings.Contains(string(got), "ready\n") {
		f := <-st.Frames()
		if f.Terminal() {
			t.Fatalf("ended early: %v", f)
		}
		got = append(got, f.Data...)
	}
	if err := a1.WriteStdin(ctx, h, "big", []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	for len(got) < 1000000 {
		f := <-st.Frames()
		if f.Terminal() {
			t.Fatalf("ended early: %v", f)
		}
		if f.Stream == adapter.Stdout {
			got = append(got, f.Data...)
		}
	}
	a1.Close() // the driver dies mid-attach

	a2 := s.New(t)
	h2, err := a2.Get(ctx, "killed-driver")
	if err != nil || !h2.Same(h) {
		t.Fatalf("Get = %v %v", h2, err)
	}
	st2, err := a2.Attach(ctx, h2, "big", adapter.Cursor{Stdout: int64(len(got))})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	got = append(got, ReadToExit(t, st2)...)
	r, err := a2.Exec(ctx, h2, adapter.Shell("cat data"))
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte("ready\n"), r.Stdout...)
	if len(r.Stdout) != 3000000 || string(got) != string(want) {
		t.Fatalf("read %d bytes across the driver's death, want the %d the session wrote, byte-exact", len(got), len(want))
	}
}

// SandboxGone: a sandbox deleted behind the adapter's back (by another
// adapter) reads as not_found for its sessions, and its detached
// runner-shim sessions die with it.
func SandboxGone(t *testing.T, s Subject) {
	ctx := Ctx(t)
	a := s.New(t)
	h, err := a.Create(ctx, "gone", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid := Sleeper(t, ctx, a, h, s.Dir(h))
	other := s.New(t)
	if err := other.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sessions(ctx, h); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Sessions of a deleted sandbox = %v, want not_found", err)
	}
	if Running(pid) {
		t.Fatalf("the session's command %d outlived its sandbox", pid)
	}
}

// Sleeper spawns session "s" in h, a shell that writes its pid to the
// file pid in dir (h's working directory on the host), says ready and
// sleeps 60 s as that pid; it returns the pid once ready was read. The
// stream is closed at t's cleanup.
func Sleeper(t *testing.T, ctx context.Context, a adapter.Adapter, h adapter.Handle, dir string) int {
	t.Helper()
	st, err := a.Spawn(ctx, h, adapter.Shell("echo $$ > pid; echo ready; exec sleep 60"), adapter.SpawnOptions{SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for f := range st.Frames() {
		if strings.Contains(string(f.Data), "ready") {
			break
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	return pid
}

// RateLimitedAndOutage: 429 is rate_limited with its Retry-After; an
// outage is unavailable, never not_found, for get, create and exec; after
// it, get and exec work again.
func RateLimitedAndOutage(t *testing.T, s Subject) {
	ctx := Ctx(t)
	a := s.New(t)
	h, err := a.Create(ctx, "limited", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.RateLimit(1, 2*time.Second)
	_, err = a.Get(ctx, "limited")
	var rl *adapter.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 2*time.Second {
		t.Fatalf("Get under a rate limit = %v, want rate_limited after 2s", err)
	}
	restore := s.Outage()
	for name, err := range map[string]error{
		"Get":    func() error { _, err := a.Get(ctx, "limited"); return err }(),
		"Create": func() error { _, err := a.Create(ctx, "limited", adapter.CreateOptions{}); return err }(),
		"Exec":   func() error { _, err := a.Exec(ctx, h, adapter.Shell("true")); return err }(),
	} {
		if !errors.Is(err, adapter.ErrUnavailable) {
			t.Errorf("%s during an outage = %v, want unavailable", name, err)
		}
	}
	restore()
	if got, err := a.Get(ctx, "limited"); err != nil || !got.Same(h) {
		t.Fatalf("Get after the outage = %v %v", got, err)
	}
	if r, err := a.Exec(ctx, h, adapter.Shell("echo back")); err != nil || string(r.Stdout) != "back\n" {
		t.Fatalf("Exec after the outage = %q %v", r.Stdout, err)
	}
}

// Running reports whether pid is a live process (not a zombie) after up
// to 2 s for it to go.
func Running(pid int) bool {
	for range 200 {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || bytes.Contains(st, []byte(") Z ")) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// ReadToExit reads st to its terminal frame and returns every byte of
// data before it; an error frame, an exit other than success, or frames
// that end with no terminal frame fail t.
func ReadToExit(t testing.TB, st adapter.Stream) []byte {
	t.Helper()
	var out []byte
	for f := range st.Frames() {
		if f.Err != nil {
			t.Fatalf("stream: %v", f.Err)
		}
		if f.Exit != nil {
			if !f.Exit.Success() {
				t.Fatalf("exit %v", f.Exit)
			}
			return out
		}
		out = append(out, f.Data...)
	}
	t.Fatalf("the stream ended without a terminal frame after %d bytes", len(out))
	return nil
}
