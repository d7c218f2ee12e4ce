package hostedtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// Shims are the two runner-shim binaries a provider's tests hand their
// stand-in: Current reports the version under test, Old another one
// (v0.0.0-old). A package's TestMain builds them once with [Shims.Main].
type Shims struct {
	Current, Old string
	// Err is the build's failure: every test that needs a binary fails
	// on it (through [Shims.Dir] or [Shims.Binary]).
	Err error
}

// Main builds the binaries into a fresh directory named for prefix,
// runs m and removes the directory; TestMain hands its result to
// os.Exit. The directory is 0755: a stand-in may run the binaries as its
// sandbox user.
func (s *Shims) Main(m *testing.M, prefix, version string) int {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	s.Current, s.Old = filepath.Join(dir, "runner-shim"), filepath.Join(dir, "runner-shim-old")
	for bin, v := range map[string]string{s.Current: version, s.Old: "v0.0.0-old"} {
		if s.Err = BuildShim(bin, v); s.Err != nil {
			break
		}
	}
	return m.Run()
}

// Dir fails t if the binaries did not build, and returns a fresh
// directory named for prefix, short because runner-shim's socket paths
// under it must fit in 107 bytes; it is removed at t's cleanup.
func (s *Shims) Dir(t testing.TB, prefix string) string {
	t.Helper()
	if s.Err != nil {
		t.Fatal(s.Err)
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Binary fails t if the binaries did not build, and returns Current's
// bytes, read now, as a hosted.Config.ShimBinary.
func (s *Shims) Binary(t testing.TB) func() ([]byte, error) {
	t.Helper()
	if s.Err != nil {
		t.Fatal(s.Err)
	}
	bin, err := os.ReadFile(s.Current)
	if err != nil {
		t.Fatal(err)
	}
	return func() ([]byte, error) { return bin, nil }
}

// Open makes an adapter of cfg, changed by mod when it is not nil, with
// newAdapter, failing t on its error; it is closed at t's cleanup.
func Open[C any, A interface{ Close() error }](t testing.TB, cfg C, mod func(*C), newAdapter func(C) (A, error)) A {
	t.Helper()
	if mod != nil {
		mod(&cfg)
	}
	a, err := newAdapter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// Create creates the sandbox name on a with default options, failing t
// when it cannot.
func Create(t testing.TB, ctx context.Context, a adapter.Adapter, name string) adapter.Handle {
	t.Helper()
	h, err := a.Create(ctx, name, adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return h
}

// Check fails t if err is not nil.
func Check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Ctx is a context for one test: 90 s, cancelled at t's cleanup.
func Ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Live returns the live smoke test's credential from the environment
// variable env, skipping t (the test is off by default) when it is
// unset, and fails t if the binaries did not build.
func (s *Shims) Live(t *testing.T, env, provider, doc string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		t.Skipf("%s is not set: the live %s smoke test is off (see %s)", env, provider, doc)
	}
	if s.Err != nil {
		t.Fatal(s.Err)
	}
	return v
}

// CtxWithin is a context for one test that ends after d or with t.
func CtxWithin(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// WantKind reports (t.Errorf) err's kind in the adapter taxonomy when it
// is not want; what names the call.
func WantKind(t *testing.T, what string, err error, want adapter.Kind) {
	t.Helper()
	if got := adapter.KindOf(err); got != want {
		t.Errorf("%s: got kind %q (%v), want %q", what, got, err, want)
	}
}

// Install is how [VerifyAtCreate] makes a provider's adapters over one
// stand-in (with [Subject.Dir] to find an installed binary).
type Install struct {
	// Version is the runner-shim version the adapters want.
	Version string
	// Old returns an adapter whose runner-shim reports v0.0.0-old.
	Old func(t testing.TB) Adapter
	// Installer returns an adapter whose image has no runner-shim and
	// which installs bin's bytes at Path, relative to Dir.
	Installer func(t testing.TB, bin func() ([]byte, error)) Adapter
	Path      string
	// Names are the sandboxes' names: the refused one, the installed one.
	Names [2]string
}

// VerifyAtCreate: an image with another runner-shim version is refused
// at create, clearly (a provider error naming both versions), and the
// sandbox made for it is deleted; one without runner-shim gets it
// installed once, executable, when the adapter carries the binary. It
// returns the installed sandbox for the provider's own checks.
func (s *Shims) VerifyAtCreate(t *testing.T, sub Subject, in Install) adapter.Handle {
	t.Helper()
	ctx := Ctx(t)
	a := in.Old(t)
	_, err := a.Create(ctx, in.Names[0], adapter.CreateOptions{})
	var pe *adapter.ProviderError
	if !errors.As(err, &pe) || !strings.Contains(pe.Detail, "v0.0.0-old") || !strings.Contains(pe.Detail, in.Version) {
		t.Fatalf("Create with a mismatched runner-shim = %v, want a provider error naming both versions", err)
	}
	if _, err := a.Get(ctx, in.Names[0]); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Get after a refused create = %v, want not_found (the sandbox was deleted)", err)
	}
	bin, err := os.ReadFile(s.Current)
	if err != nil {
		t.Fatal(err)
	}
	installs := 0
	b := in.Installer(t, func() ([]byte, error) { installs++; return bin, nil })
	h, err := b.Create(ctx, in.Names[1], adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("Create with an installer = %v", err)
	}
	r, err := b.Exec(ctx, h, adapter.Shell("echo hi"))
	if err != nil || string(r.Stdout) != "hi\n" || installs != 1 {
		t.Fatalf("Exec after install = %q %v, %d installs", r.Stdout, err, installs)
	}
	if fi, err := os.Stat(filepath.Join(sub.Dir(h), in.Path)); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("installed runner-shim: %v %v", fi, err)
	}
	return h
}
