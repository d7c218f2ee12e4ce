package e2b_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

const shimVersion = "v0.0.0-e2b-test"

// shimBins holds the runner-shim binaries the stand-in's "template"
// carries, built once by TestMain from ./cmd/runner-shim.
var (
	shimBin, oldShimBin string
	buildErr            error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "e2bbin")
	if err != nil {
		panic(err)
	}
	// The stand-in runs its processes as the sandbox user (uid 2001)
	// when the test is root: the binaries must be theirs to run.
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	shimBin, oldShimBin = filepath.Join(dir, "runner-shim"), filepath.Join(dir, "runner-shim-old")
	for bin, v := range map[string]string{shimBin: shimVersion, oldShimBin: "v0.0.0-old"} {
		if buildErr = hostedtest.BuildShim(bin, v); buildErr != nil {
			break
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// standIn starts an E2B stand-in whose sandboxes live in a short
// directory (runner-shim's socket paths must fit), and a client for it.
func standIn(t testing.TB) (*e2btest.Server, *e2b.Client) {
	t.Helper()
	return standInWith(t, e2btest.Options{})
}

// standInWith is standIn with the stand-in's options (Dir is set here).
func standInWith(t testing.TB, opts e2btest.Options) (*e2btest.Server, *e2b.Client) {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	dir, err := os.MkdirTemp("", "e2b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	opts.Dir = dir
	srv := e2btest.New(t, opts)
	c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret(srv.APIKey), APIURL: srv.URL(), SandboxURL: srv.SandboxURL()})
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func newAdapter(t testing.TB, c *e2b.Client, mod func(*e2b.AdapterConfig)) *e2b.Adapter {
	t.Helper()
	cfg := e2b.AdapterConfig{Client: c, Template: "runner", Config: hosted.Config{Version: shimVersion, Shim: shimBin, Lease: 3 * time.Second, ReattachWindow: 20 * time.Second}}
	if mod != nil {
		mod(&cfg)
	}
	a, err := e2b.NewAdapter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestConformance runs the provider-neutral suite against the adapter
// and the stand-in, every command through the real runner-shim; an outage
// is the control plane's 503 with the envd proxy dropping every
// connection.
func TestConformance(t *testing.T) { hostedtest.Conformance(t, subject) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestDriverKilledMidAttach: hostedtest.DriverKilledMidAttach over envd.
func TestDriverKilledMidAttach(t *testing.T) { hostedtest.DriverKilledMidAttach(t, subject(t)) }

// TestVerifyAtCreate: a template with another runner-shim version is
// refused at create, clearly, and the sandbox made for it is deleted; a
// template without one gets it installed through envd's files API when
// the adapter carries the binary.
func TestVerifyAtCreate(t *testing.T) {
	srv, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, func(cfg *e2b.AdapterConfig) { cfg.Shim = oldShimBin })
	_, err := a.Create(ctx, "old-template", adapter.CreateOptions{})
	var pe *adapter.ProviderError
	if !errors.As(err, &pe) || !strings.Contains(pe.Detail, "v0.0.0-old") || !strings.Contains(pe.Detail, shimVersion) {
		t.Fatalf("Create with a mismatched runner-shim = %v, want a provider error naming both versions", err)
	}
	if _, err := a.Get(ctx, "old-template"); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Get after a refused create = %v, want not_found (the sandbox was deleted)", err)
	}

	bin, err := os.ReadFile(shimBin)
	if err != nil {
		t.Fatal(err)
	}
	installs := 0
	b := newAdapter(t, c, func(cfg *e2b.AdapterConfig) {
		cfg.Shim = "./.runner/runner-shim"
		cfg.ShimBinary = func() ([]byte, error) { installs++; return bin, nil }
	})
	h, err := b.Create(ctx, "bare-template", adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("Create with an installer = %v", err)
	}
	r, err := b.Exec(ctx, h, adapter.Shell("echo hi"))
	if err != nil || string(r.Stdout) != "hi\n" || installs != 1 {
		t.Fatalf("Exec after install = %q %v, %d installs", r.Stdout, err, installs)
	}
	dir, _ := srv.Dir(h.ID)
	if fi, err := os.Stat(filepath.Join(dir, ".runner", "runner-shim")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("installed runner-shim: %v %v", fi, err)
	}
}

// TestSandboxGone: a sandbox deleted behind the adapter's back reads as
// not_found for its sessions (envd's 502, confirmed by GET's 404), and
// its detached runner-shim sessions die with it (hostedtest.SandboxGone).
func TestSandboxGone(t *testing.T) { hostedtest.SandboxGone(t, subject(t)) }

// subject is the adapters over one stand-in, for adapter/hosted/hostedtest.
func subject(tb testing.TB) hostedtest.Subject {
	srv, c := standIn(tb)
	return hostedtest.Subject{
		New:       func(t testing.TB) hostedtest.Adapter { return newAdapter(t, c, nil) },
		Dir:       func(h adapter.Handle) string { dir, _ := srv.Dir(h.ID); return dir },
		RateLimit: srv.RateLimit,
		Outage: func() func() {
			srv.SetOutage(true)
			srv.SetDropEnvd(true)
			return func() { srv.SetOutage(false); srv.SetDropEnvd(false) }
		},
		InterruptList: func() { srv.InterruptList(1) },
	}
}

// TestRateLimitedAndOutage: 429 is rate_limited with its Retry-After, a
// 503 outage is unavailable, never not_found, for get, create and exec
// (hostedtest.RateLimitedAndOutage).
func TestRateLimitedAndOutage(t *testing.T) { hostedtest.RateLimitedAndOutage(t, subject(t)) }
