package e2b_test

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/internal/logsink"
)

// shortTTL is the stand-in's default time to live in these tests: E2B's
// is 15 s; the adapter's configuration stays the documented one.
const shortTTL = 2 * time.Second

// documented returns an adapter with exactly the configuration
// docs/providers/e2b.md shows (no Timeout, no Lease).
func documented(t *testing.T, c *e2b.Client) *e2b.Adapter {
	t.Helper()
	a, err := e2b.NewAdapter(e2b.AdapterConfig{Client: c, Template: "runner", Config: hosted.Config{Version: shimVersion, Shim: shims.Current}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// counter prints lines 0..n-1, one every 100 ms, then exits with code.
func counter(n, code int) (adapter.Command, string) {
	var want strings.Builder
	for i := range n {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	return adapter.Shell(fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "line $i"; i=$((i+1)); sleep 0.1; done; exit %d`, n, code)), want.String()
}

// readAll reads a stream to its terminal frame: stdout, and the exit.
func readAll(t *testing.T, st adapter.Stream) (string, adapter.Exit) {
	t.Helper()
	defer st.Close()
	var out []byte
	timeout := time.After(60 * time.Second)
	for {
		select {
		case f := <-st.Frames():
			switch {
			case f.Err != nil:
				t.Fatalf("stream ended by %v after %q", f.Err, out)
			case f.Exit != nil:
				return string(out), *f.Exit
			case f.Stream == adapter.Stdout:
				out = append(out, f.Data...)
			}
		case <-timeout:
			t.Fatalf("stream did not end; read %q", out)
		}
	}
}

// waitState waits until the stand-in shows the sandbox in state.
func waitState(t *testing.T, srv *e2btest.Server, id, state string, within time.Duration) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		got, ok := srv.State(id)
		if ok && got == state {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("sandbox %s is %q (exists: %v) after %v, want %q", id, got, ok, within, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLeftAlonePastTheTimeToLive: a session spawned with the documented
// configuration and left alone past the time to live the control plane
// enforces: the sandbox is paused, not killed (autoPause), Get and List
// still show it, and an attach resumes it (connect) and reads the
// session to its true exit with every byte.
func TestLeftAlonePastTheTimeToLive(t *testing.T) {
	srv, c := standInWith(t, e2btest.Options{DefaultTimeout: shortTTL})
	ctx := ctxT(t)
	a := documented(t, c)
	h := hostedtest.Create(t, ctx, a, "left-alone")
	cmd, want := counter(40, 7) // 4 s of output: it spans the pause
	st, err := a.Spawn(ctx, h, cmd, adapter.SpawnOptions{SessionID: "long"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close() // left alone: nothing holds the sandbox
	waitState(t, srv, h.ID, "paused", 3*shortTTL)
	time.Sleep(shortTTL) // paused for a while: the session is frozen, not gone

	b := documented(t, c) // another driver finds it too
	if got, err := b.Get(ctx, "left-alone"); err != nil || !got.Same(h) {
		t.Fatalf("Get of the paused sandbox = %v, %v; want %v", got, err, h)
	}
	page, err := b.List(ctx, adapter.ListOptions{})
	if err != nil || !slices.ContainsFunc(page.Handles, h.Same) {
		t.Fatalf("List while paused = %v, %v; want it to show %v", page, err, h)
	}
	if s, _ := srv.State(h.ID); s != "paused" {
		t.Fatalf("Get and List resumed the sandbox (%s): only a use should", s)
	}
	st, err = a.Attach(ctx, h, "long", adapter.Cursor{})
	if err != nil {
		t.Fatalf("Attach after the time to live = %v, want the session", err)
	}
	out, exit := readAll(t, st)
	if out != want || exit.Code != 7 || exit.Signal != "" {
		t.Fatalf("after the pause: stdout %q exit %v; want every line and exit 7", out, exit)
	}
	if n, _ := srv.Pauses(h.ID); n < 1 {
		t.Fatalf("the sandbox was paused %d times; the test did not cross the time to live", n)
	}
}

// TestAttachLongerThanTheTimeToLive: an attach that streams for twice
// the time to live gets every byte, and the lease kept the sandbox
// running throughout (never paused).
func TestAttachLongerThanTheTimeToLive(t *testing.T) {
	srv, c := standInWith(t, e2btest.Options{DefaultTimeout: shortTTL})
	ctx := ctxT(t)
	a := documented(t, c)
	h := hostedtest.Create(t, ctx, a, "streaming")
	cmd, want := counter(2*int(shortTTL/(100*time.Millisecond))+10, 3)
	st, err := a.Spawn(ctx, h, cmd, adapter.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, exit := readAll(t, st)
	if out != want || exit.Code != 3 {
		t.Fatalf("stdout %q exit %v; want every line and exit 3", out, exit)
	}
	if n, _ := srv.Pauses(h.ID); n != 0 {
		t.Fatalf("the sandbox was paused %d times while the adapter streamed from it, want 0 (the lease renews it)", n)
	}
	if srv.Requests("POST /sandboxes/"+h.ID+"/timeout") < 2 {
		t.Fatalf("the lease renewed the time to live %d times over %v", srv.Requests("POST /sandboxes/"+h.ID+"/timeout"), 2*shortTTL)
	}
}

// TestPausedIsNeverNotFound: a sandbox paused behind the adapter (the
// API's pause) is listed, got, and used: a driver that already holds it
// resumes it on envd's 502 and runs the command; a new driver resumes it
// on first use. Never not_found.
func TestPausedIsNeverNotFound(t *testing.T) {
	srv, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "paused")
	for i, drv := range []*e2b.Adapter{a, newAdapter(t, c, nil)} {
		if err := c.Pause(ctx, h.ID); err != nil {
			t.Fatal(err)
		}
		if got, err := drv.Get(ctx, "paused"); err != nil || !got.Same(h) {
			t.Fatalf("driver %d: Get of a paused sandbox = %v, %v", i, got, err)
		}
		r, err := drv.Exec(ctx, h, adapter.Shell("echo back; exit 5"))
		if err != nil || string(r.Stdout) != "back\n" || r.Exit.Code != 5 {
			t.Fatalf("driver %d: Exec in a paused sandbox = %q %v, %v; want back, exit 5", i, r.Stdout, r.Exit, err)
		}
		if s, _ := srv.State(h.ID); s != "running" {
			t.Fatalf("driver %d: sandbox %s after a use, want running", i, s)
		}
	}
	if err := a.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, h, adapter.Shell("true")); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Exec after Destroy = %v, want not_found (absence still reads as absence)", err)
	}
}

// TestCreateAsksSecureAndAutoPause: the adapter's sandboxes require the
// envd token (a request without it is denied) and pause on expiry.
func TestCreateAsksSecureAndAutoPause(t *testing.T) {
	srv, c := standInWith(t, e2btest.Options{DefaultTimeout: shortTTL})
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "secure")
	sb, err := c.Get(ctx, h.ID)
	if err != nil || sb.EnvdAccessToken.IsZero() {
		t.Fatalf("GET = %v, %v; want an envd access token (secure: true)", sb, err)
	}
	anon := sb
	anon.EnvdAccessToken = e2b.Secret{}
	_, err = c.Envd(anon).List(ctx)
	if !errors.Is(err, adapter.ErrDenied) {
		t.Fatalf("envd without the token = %v, want denied", err)
	}
	waitState(t, srv, h.ID, "paused", 3*shortTTL)
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer = logsink.Buffer

// TestLeaseLogsNoSecret: the lease's log (a renewal that failed in an
// outage, a resume) names the sandbox and never the API key or the
// envd access token.
func TestLeaseLogsNoSecret(t *testing.T) {
	srv, c := standInWith(t, e2btest.Options{DefaultTimeout: shortTTL})
	ctx := ctxT(t)
	var logs syncBuffer
	a := newAdapter(t, c, func(cfg *e2b.AdapterConfig) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	h := hostedtest.Create(t, ctx, a, "logged")
	st, err := a.Spawn(ctx, h, adapter.Shell("sleep 2; echo done"), adapter.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetOutage(true) // the renewals during it fail
	time.Sleep(shortTTL / 2)
	srv.SetOutage(false)
	if out, exit := readAll(t, st); out != "done\n" || !exit.Success() {
		t.Fatalf("session: %q %v", out, exit)
	}
	if err := c.Pause(ctx, h.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, h, adapter.Shell("true")); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Get(ctx, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := logs.String()
	if !strings.Contains(got, "renew sandbox timeout") || !strings.Contains(got, "resumed a paused sandbox") || !strings.Contains(got, h.ID) {
		t.Fatalf("the lease logged %q; want the failed renewal and the resume, naming %s", got, h.ID)
	}
	for name, secret := range map[string]string{"API key": srv.APIKey, "envd token": sb.EnvdAccessToken.Reveal()} {
		if secret == "" || strings.Contains(got, secret) {
			t.Errorf("the log holds the %s (or it is empty): %q", name, got)
		}
	}
}

// TestNegativeTimeoutRefused: a time to live below zero is refused at
// configuration, never sent.
func TestNegativeTimeoutRefused(t *testing.T) {
	_, c := standIn(t)
	_, err := e2b.NewAdapter(e2b.AdapterConfig{Client: c, Template: "runner", Timeout: -1, Config: hosted.Config{Version: shimVersion}})
	if !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("NewAdapter with Timeout -1 = %v, want invalid", err)
	}
}
