package daytona_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona"
	"github.com/agentrunner/runner/adapter/daytona/daytonatest"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

const shimVersion = "v0.0.0-daytona-test"

// shims are the runner-shim binaries the stand-in's "snapshot" carries,
// built once by TestMain from ./cmd/runner-shim.
var shims hostedtest.Shims

func TestMain(m *testing.M) { os.Exit(shims.Main(m, "dtbin", shimVersion)) }

// standIn starts a Daytona stand-in whose sandboxes live in a short
// directory (runner-shim's socket paths must fit), and a client for it.
func standIn(t testing.TB) (*daytonatest.Server, *daytona.Client) {
	t.Helper()
	srv := daytonatest.New(t, daytonatest.Options{Dir: shims.Dir(t, "dt")})
	c, err := daytona.New(daytona.Config{APIKey: daytona.NewSecret(srv.APIKey), APIURL: srv.URL(), PollInterval: 10 * time.Millisecond})
	hostedtest.Check(t, err)
	return srv, c
}

func newAdapter(t testing.TB, c *daytona.Client, mod func(*daytona.AdapterConfig)) *daytona.Adapter {
	t.Helper()
	cfg := daytona.AdapterConfig{Client: c, Config: hosted.Config{Version: shimVersion, Shim: shims.Current, Lease: 3 * time.Second, ReattachWindow: 20 * time.Second}}
	return hostedtest.Open(t, cfg, mod, daytona.NewAdapter)
}

// TestConformance runs the provider-neutral suite against the adapter
// and the stand-in, every command through the real runner-shim; an outage
// is the API's 503 with the toolbox proxy dropping every connection.
func TestConformance(t *testing.T) { hostedtest.Conformance(t, subject) }

var ctxT = hostedtest.Ctx

// TestDriverKilledMidAttach: hostedtest.DriverKilledMidAttach through
// toolbox sessions (3 MB of random bytes, every frame base64 in the log).
func TestDriverKilledMidAttach(t *testing.T) { hostedtest.DriverKilledMidAttach(t, subject(t)) }

// subject is the adapters over one stand-in, for adapter/hosted/hostedtest:
// an outage is the API's 503 with the toolbox proxy dropping connections.
func subject(tb testing.TB) hostedtest.Subject {
	srv, c := standIn(tb)
	return hostedtest.Subject{
		New:       func(t testing.TB) hostedtest.Adapter { return newAdapter(t, c, nil) },
		Dir:       func(h adapter.Handle) string { home, _ := srv.Home(h.ID); return home },
		RateLimit: srv.RateLimit,
		Outage: func() func() {
			srv.SetOutage(true)
			srv.SetDropToolbox(true)
			return func() { srv.SetOutage(false); srv.SetDropToolbox(false) }
		},
		InterruptList: func() { srv.InterruptList(1) },
	}
}

// mangled is every byte sequence the toolbox's session log changes: NUL,
// the stream markers, invalid UTF-8, a missing final newline.
const mangled = "a\x00b\x01\x01\x01c\x02\x02\x02d\xff\xfe\xc3e\r\n\n\x00"

// TestBinarySurvives: output and input that the toolbox would mangle
// (NULs dropped, markers stripped, invalid UTF-8 replaced, a newline
// added, input echoed) arrive byte-exact, through Exec, a spawned stream
// and stdin, because only runner-shim's base64 crosses the toolbox.
func TestBinarySurvives(t *testing.T) {
	srv, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "binary")
	home, _ := srv.Home(h.ID)
	if err := os.WriteFile(filepath.Join(home, "blob"), []byte(mangled), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := a.Exec(ctx, h, adapter.Shell("cat blob; cat blob >&2; exit 7"))
	if err != nil || string(r.Stdout) != mangled || string(r.Stderr) != mangled || r.Exit.Code != 7 {
		t.Fatalf("Exec = stdout %q stderr %q %v %v; want %q twice and exit 7", r.Stdout, r.Stderr, r.Exit, err, mangled)
	}
	st, err := a.Spawn(ctx, h, adapter.Shell("cat"), adapter.SpawnOptions{SessionID: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := a.WriteStdin(ctx, h, "echo", []byte(mangled)); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(ctx, h, "echo"); err != nil {
		t.Fatal(err)
	}
	out := hostedtest.ReadToExit(t, st)
	if string(out) != mangled {
		t.Fatalf("cat of stdin = %q, want %q", out, mangled)
	}
}

// TestHostileArgv: argv with quotes, newlines, command substitutions and
// a leading dash reaches the program as exactly those words, and runs
// nothing else (the executor's script quotes every word; no caller text
// goes through a command line Daytona splits).
func TestHostileArgv(t *testing.T) {
	srv, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "hostile")
	words := []string{`it's`, `"quoted"`, "two\nlines", "$(touch pwned1)", "`touch pwned2`", `'; touch pwned3; '`, `\'`, "-n", "", " spaced "}
	r, err := a.Exec(ctx, h, adapter.Command{Path: "printf", Args: append([]string{`[%s]`}, words...)})
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, w := range words {
		want.WriteString("[" + w + "]")
	}
	if string(r.Stdout) != want.String() || !r.Exit.Success() {
		t.Fatalf("printf of hostile words = %q %v, want %q", r.Stdout, r.Exit, want.String())
	}
	home, _ := srv.Home(h.ID)
	for _, f := range []string{"pwned1", "pwned2", "pwned3"} {
		if _, err := os.Stat(filepath.Join(home, f)); err == nil {
			t.Errorf("%s exists: a word was run as a command", f)
		}
	}
}

// TestVerifyAtCreate: a snapshot with another runner-shim version is
// refused at create, clearly, and the sandbox made for it is deleted; one
// without runner-shim gets it uploaded and made executable when the
// adapter carries the binary.
func TestVerifyAtCreate(t *testing.T) {
	srv, c := standIn(t)
	missing := newAdapter(t, c, func(cfg *daytona.AdapterConfig) { cfg.Shim = ".runner/runner-shim" })
	if _, err := missing.Create(ctxT(t), "bare-refused", adapter.CreateOptions{}); !errors.Is(err, adapter.ErrProvider) {
		t.Fatalf("Create without runner-shim and no installer = %v, want provider", err)
	}
	h := shims.VerifyAtCreate(t, hostedtest.Subject{Dir: func(h adapter.Handle) string { home, _ := srv.Home(h.ID); return home }}, hostedtest.Install{
		Version: shimVersion,
		Old: func(t testing.TB) hostedtest.Adapter {
			return newAdapter(t, c, func(cfg *daytona.AdapterConfig) { cfg.Shim = shims.Old })
		},
		Installer: func(t testing.TB, bin func() ([]byte, error)) hostedtest.Adapter {
			return newAdapter(t, c, func(cfg *daytona.AdapterConfig) { cfg.Shim, cfg.ShimBinary = ".runner/runner-shim", bin })
		},
		Path:  ".runner/runner-shim",
		Names: [2]string{"old-snapshot", "bare-snapshot"},
	})
	if srv.Requests("POST /toolbox/"+h.ID+"/process/execute") != 1 {
		t.Errorf("chmod through /process/execute ran %d times, want 1", srv.Requests("POST /toolbox/"+h.ID+"/process/execute"))
	}
}

// TestCreateAdoptsTakenName: a sandbox that already has the name (a
// create whose answer was lost) is adopted on 409, not duplicated.
func TestCreateAdoptsTakenName(t *testing.T) {
	_, c := standIn(t)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, daytona.CreateSandbox{Name: "lost-answer"})
	if err != nil {
		t.Fatal(err)
	}
	a := newAdapter(t, c, nil)
	h, err := a.Create(ctx, "lost-answer", adapter.CreateOptions{})
	if err != nil || h.ID != sb.ID || h.Name != "lost-answer" {
		t.Fatalf("Create of a taken name = %v %v, want the existing sandbox %s", h, err, sb.ID)
	}
	all, err := c.ListAll(ctx, daytona.ListOptions{})
	if err != nil || len(all) != 1 {
		t.Fatalf("listing after adopt = %d sandboxes %v, want 1", len(all), err)
	}
}

// TestSandboxGone: a sandbox deleted behind the adapter's back reads as
// not_found for its sessions (the proxy's 502, confirmed by GET), and its
// detached runner-shim sessions die with it (hostedtest.SandboxGone).
func TestSandboxGone(t *testing.T) { hostedtest.SandboxGone(t, subject(t)) }

// TestSuspendedRefusesSessions: a stopped sandbox's session calls are
// invalid (suspended), never not_found; after Resume, files survive and
// the sessions of before are gone with their processes (Daytona's stop
// ends every process).
func TestSuspendedRefusesSessions(t *testing.T) {
	srv, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "parked")
	if _, err := a.Exec(ctx, h, adapter.Shell("echo kept > f")); err != nil {
		t.Fatal(err)
	}
	home, _ := srv.Home(h.ID)
	pid := hostedtest.Sleeper(t, ctx, a, h, home)
	if err := a.Suspend(ctx, h); err != nil {
		t.Fatal(err)
	}
	if hostedtest.Running(pid) {
		t.Fatalf("the session's command %d outlived the stop", pid)
	}
	if _, err := a.Exec(ctx, h, adapter.Shell("true")); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("Exec in a stopped sandbox = %v, want invalid", err)
	}
	if err := a.Resume(ctx, h); err != nil {
		t.Fatal(err)
	}
	r, err := a.Exec(ctx, h, adapter.Shell("cat f"))
	if err != nil || string(r.Stdout) != "kept\n" {
		t.Fatalf("after resume cat f = %q %v", r.Stdout, err)
	}
}

// TestRateLimitedAndOutage: 429 is rate_limited with its Retry-After; a
// 503 outage of the API with the toolbox proxy dropping connections is
// unavailable, never not_found, for get, create and exec
// (hostedtest.RateLimitedAndOutage).
func TestRateLimitedAndOutage(t *testing.T) { hostedtest.RateLimitedAndOutage(t, subject(t)) }

// TestGetNameThatIsAnID: GET takes an id or a name, so a sandbox named
// like another's id must not be confused with it: Get returns the one
// with the name, and not_found only when none has it.
func TestGetNameThatIsAnID(t *testing.T) {
	_, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	first, err := a.Create(ctx, "first", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, first.ID); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Get of a name nobody has (another sandbox's id) = %v, want not_found", err)
	}
	// The stand-in, like the API's id-or-name lookup, refuses the name
	// with 409: never adopt the sandbox whose id it is.
	twin, err := a.Create(ctx, first.ID, adapter.CreateOptions{})
	switch {
	case err == nil && twin.ID == first.ID:
		t.Fatalf("Create of the name %s adopted the sandbox whose id it is", first.ID)
	case err == nil:
		if got, err := a.Get(ctx, first.ID); err != nil || !got.Same(twin) {
			t.Fatalf("Get(%s) = %v %v, want %v", first.ID, got, err, twin)
		}
	case !errors.Is(err, adapter.ErrInvalid):
		t.Fatalf("Create of a name that is another sandbox's id = %v, want invalid", err)
	}
	if got, err := a.Get(ctx, "first"); err != nil || !got.Same(first) {
		t.Fatalf("Get(first) = %v %v, want %v", got, err, first)
	}
}
