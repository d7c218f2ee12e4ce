package e2b_test

import (
	"os"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

const shimVersion = "v0.0.0-e2b-test"

// shims are the runner-shim binaries the stand-in's "template" carries,
// built once by TestMain from ./cmd/runner-shim (in a 0755 directory: the
// stand-in runs its processes as the sandbox user, uid 2001, when the
// test is root, so the binaries must be theirs to run).
var shims hostedtest.Shims

func TestMain(m *testing.M) { os.Exit(shims.Main(m, "e2bbin", shimVersion)) }

// standIn starts an E2B stand-in whose sandboxes live in a short
// directory (runner-shim's socket paths must fit), and a client for it.
func standIn(t testing.TB) (*e2btest.Server, *e2b.Client) {
	t.Helper()
	return standInWith(t, e2btest.Options{})
}

// standInWith is standIn with the stand-in's options (Dir is set here).
func standInWith(t testing.TB, opts e2btest.Options) (*e2btest.Server, *e2b.Client) {
	t.Helper()
	opts.Dir = shims.Dir(t, "e2b")
	srv := e2btest.New(t, opts)
	c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret(srv.APIKey), APIURL: srv.URL(), SandboxURL: srv.SandboxURL()})
	hostedtest.Check(t, err)
	return srv, c
}

func newAdapter(t testing.TB, c *e2b.Client, mod func(*e2b.AdapterConfig)) *e2b.Adapter {
	t.Helper()
	cfg := e2b.AdapterConfig{Client: c, Template: "runner", Config: hosted.Config{Version: shimVersion, Shim: shims.Current, Lease: 3 * time.Second, ReattachWindow: 20 * time.Second}}
	return hostedtest.Open(t, cfg, mod, e2b.NewAdapter)
}

// TestConformance runs the provider-neutral suite against the adapter
// and the stand-in, every command through the real runner-shim; an outage
// is the control plane's 503 with the envd proxy dropping every
// connection.
func TestConformance(t *testing.T) { hostedtest.Conformance(t, subject) }

var ctxT = hostedtest.Ctx

// TestDriverKilledMidAttach: hostedtest.DriverKilledMidAttach over envd.
func TestDriverKilledMidAttach(t *testing.T) { hostedtest.DriverKilledMidAttach(t, subject(t)) }

// TestVerifyAtCreate: a template with another runner-shim version is
// refused at create, clearly, and the sandbox made for it is deleted; a
// template without one gets it installed through envd's files API when
// the adapter carries the binary.
func TestVerifyAtCreate(t *testing.T) {
	srv, c := standIn(t)
	shims.VerifyAtCreate(t, hostedtest.Subject{Dir: func(h adapter.Handle) string { dir, _ := srv.Dir(h.ID); return dir }}, hostedtest.Install{
		Version: shimVersion,
		Old: func(t testing.TB) hostedtest.Adapter {
			return newAdapter(t, c, func(cfg *e2b.AdapterConfig) { cfg.Shim = shims.Old })
		},
		Installer: func(t testing.TB, bin func() ([]byte, error)) hostedtest.Adapter {
			return newAdapter(t, c, func(cfg *e2b.AdapterConfig) { cfg.Shim, cfg.ShimBinary = "./.runner/runner-shim", bin })
		},
		Path:  ".runner/runner-shim",
		Names: [2]string{"old-template", "bare-template"},
	})
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
