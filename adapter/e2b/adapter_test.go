package e2b_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
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
		cmd := exec.Command("go", "build", "-ldflags", "-X github.com/agentrunner/runner/version.Version="+v,
			"-o", bin, "github.com/agentrunner/runner/cmd/runner-shim")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/runner-shim: %v\n%s", err, out)
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
	cfg := e2b.AdapterConfig{Client: c, Template: "runner", Version: shimVersion, Shim: shimBin,
		Lease: 3 * time.Second, ReattachWindow: 20 * time.Second}
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
// and the stand-in, every command through the real runner-shim.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		New: func(ct conformance.T) conformance.Subject {
			tb := ct.(testing.TB)
			srv, c := standIn(tb)
			return conformance.Subject{
				Adapter: newAdapter(tb, c, nil),
				Outage: func() func() {
					// The control plane answers 503; the envd proxy drops
					// every connection.
					srv.SetOutage(true)
					srv.SetDropEnvd(true)
					return func() { srv.SetOutage(false); srv.SetDropEnvd(false) }
				},
				InterruptList: func() { srv.InterruptList(1) },
			}
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  90 * time.Second,
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestDriverKilledMidAttach: the driver (its adapter) dies while it reads
// a session that streams 3 MB; a new adapter attaches from the cursor it
// had and the two reads are the session's bytes exactly.
func TestDriverKilledMidAttach(t *testing.T) {
	_, c := standIn(t)
	ctx := ctxT(t)
	a1 := newAdapter(t, c, nil)
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

	a2 := newAdapter(t, c, nil)
	h2, err := a2.Get(ctx, "killed-driver")
	if err != nil || !h2.Same(h) {
		t.Fatalf("Get = %v %v", h2, err)
	}
	st2, err := a2.Attach(ctx, h2, "big", adapter.Cursor{Stdout: int64(len(got))})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	for {
		f := <-st2.Frames()
		if f.Err != nil {
			t.Fatalf("resumed stream: %v", f.Err)
		}
		if f.Exit != nil {
			if !f.Exit.Success() {
				t.Fatalf("exit %v", f.Exit)
			}
			break
		}
		got = append(got, f.Data...)
	}
	r, err := a2.Exec(ctx, h2, adapter.Shell("cat data"))
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte("ready\n"), r.Stdout...)
	if len(r.Stdout) != 3000000 || string(got) != string(want) {
		t.Fatalf("read %d bytes across the driver's death, want the %d the session wrote, byte-exact", len(got), len(want))
	}
}

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
// its detached runner-shim sessions die with it.
func TestSandboxGone(t *testing.T) {
	srv, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h, err := a.Create(ctx, "gone", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Spawn(ctx, h, adapter.Shell("echo $$ > pid; echo ready; exec sleep 60"), adapter.SpawnOptions{SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for f := range st.Frames() {
		if strings.Contains(string(f.Data), "ready") {
			break
		}
	}
	dir, _ := srv.Dir(h.ID)
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	other := newAdapter(t, c, nil)
	if err := other.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sessions(ctx, h); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Sessions of a deleted sandbox = %v, want not_found", err)
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	if running(pid) {
		t.Fatalf("the session's command %d outlived its sandbox", pid)
	}
}

// TestRateLimitedAndOutage: 429 is rate_limited with its Retry-After, a
// 503 outage is unavailable, never not_found, for get and create.
func TestRateLimitedAndOutage(t *testing.T) {
	srv, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h, err := a.Create(ctx, "limited", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.RateLimit(1, 2*time.Second)
	_, err = a.Get(ctx, "limited")
	var rl *adapter.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 2*time.Second {
		t.Fatalf("Get under a rate limit = %v, want rate_limited after 2s", err)
	}
	srv.SetOutage(true)
	for name, err := range map[string]error{
		"Get":    func() error { _, err := a.Get(ctx, "limited"); return err }(),
		"Create": func() error { _, err := a.Create(ctx, "limited", adapter.CreateOptions{}); return err }(),
		"Exec":   func() error { _, err := a.Exec(ctx, h, adapter.Shell("true")); return err }(),
	} {
		if !errors.Is(err, adapter.ErrUnavailable) {
			t.Errorf("%s during a 503 outage = %v, want unavailable", name, err)
		}
	}
	srv.SetOutage(false)
	if got, err := a.Get(ctx, "limited"); err != nil || !got.Same(h) {
		t.Fatalf("Get after the outage = %v %v", got, err)
	}
}
