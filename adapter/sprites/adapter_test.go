package sprites_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

const shimVersion = "v0.0.0-sprites-test"

// standInTaskSocket is /.sprite/api.sock of a stand-in sprite, from the
// working directory of its commands.
const standInTaskSocket = ".sprite/api.sock"

// The runner-shim binaries the adapter uploads, built once by TestMain
// from ./cmd/runner-shim: one of shimVersion, one of another version.
var shims hostedtest.Shims

func TestMain(m *testing.M) { os.Exit(shims.Main(m, "spritesbin", shimVersion)) }

// standIn starts a stand-in whose sprites live in a short directory
// (runner-shim's socket paths must fit in 107 bytes) and a client for it.
func standIn(t testing.TB, opts spritestest.Options) (*spritestest.Server, *sprites.Client) {
	t.Helper()
	opts.Dir = shims.Dir(t, "spr")
	srv := spritestest.New(t, opts)
	c, err := sprites.New(sprites.Config{Token: sprites.NewSecret(srv.Token), BaseURL: srv.URL()})
	hostedtest.Check(t, err)
	return srv, c
}

func binary(path string) func() ([]byte, error) {
	return func() ([]byte, error) { return os.ReadFile(path) }
}

func newAdapter(t testing.TB, c *sprites.Client, mod func(*sprites.AdapterConfig)) *sprites.Adapter {
	t.Helper()
	// The stand-in's commands run in the sprite's "/", so the Tasks API
	// socket is found relative to it.
	cfg := sprites.AdapterConfig{Client: c, TaskSocket: standInTaskSocket, Config: hosted.Config{Version: shimVersion, ShimBinary: binary(shims.Current), Lease: 3 * time.Second, ReattachWindow: 20 * time.Second}}
	return hostedtest.Open(t, cfg, mod, sprites.NewAdapter)
}

// TestConformance runs the provider-neutral suite against the adapter and
// the stand-in with its missing-exit-frame quirk on (30 % of fast execs
// close with 1000 and no exit frame, at a random seed that is logged), every
// session command through the real runner-shim uploaded at create.
func TestConformance(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("DropExitRandom seed %d", seed)
	var dropped atomic.Int64
	t.Cleanup(func() {
		t.Logf("%d execs closed without their exit frame", dropped.Load())
		if dropped.Load() == 0 && !t.Failed() {
			t.Errorf("no exec lost its exit frame: the run did not exercise the quirk")
		}
	})
	hostedtest.Conformance(t, func(tb testing.TB) hostedtest.Subject {
		srv, c := standIn(tb, spritestest.Options{DropExit: spritestest.DropExitRandom, Seed: seed})
		tb.Cleanup(func() { dropped.Add(int64(srv.DroppedExits())) })
		return hostedtest.Subject{
			New: func(t testing.TB) hostedtest.Adapter { return newAdapter(t, c, nil) },
			Outage: func() func() {
				srv.SetOutage(true)
				return func() { srv.SetOutage(false) }
			},
			InterruptList: func() { srv.InterruptList(1) },
			CorruptCheckpoint: func(h adapter.Handle, id string) error {
				return srv.CorruptCheckpoint(h.Name, id)
			},
		}
	})
}

var ctxT = hostedtest.Ctx

// readAll and readUntil read a stream as every hosted provider's tests do.
var readAll, readUntil = hostedtest.Collect, hostedtest.ReadUntil

// TestExitFrameNeverArrives: with every exec closed without its exit
// frame, the adapter still creates (upload, version check), runs execs
// whose exit codes 0, 3 and 255 arrive exactly, and drives a session
// through stdin, EOF, listing and its exit: runner-shim's answers and
// frames are the truth, never an exec status. Without guest.ErrNoStatus
// every call here fails.
func TestExitFrameNeverArrives(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{DropExit: spritestest.DropExitAlways})
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h, err := a.Create(ctx, "no-exit", adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	for _, code := range []int{0, 3, 255} {
		r, err := a.Exec(ctx, h, adapter.Shell(fmt.Sprintf("printf 'a\\000b'; exit %d", code)))
		if err != nil || string(r.Stdout) != "a\x00b" || r.Exit.Code != code || r.Exit.Reason != adapter.ReasonExited {
			t.Fatalf("Exec(exit %d) = %q %+v %v, want a\\0b and exit %d exactly", code, r.Stdout, r.Exit, err, code)
		}
	}
	r, err := a.Exec(ctx, h, adapter.Command{Path: "no-such-program-x"})
	if err != nil || r.Exit.Code != 127 {
		t.Fatalf("Exec of a missing program = %+v %v, want exit 127", r.Exit, err)
	}
	st, out, end := stdinSession(t, ctx, a, h, "s1", "echo ready; cat; exit 3", "x\x00y\n")
	defer st.Close()
	if string(out) != "x\x00y\n" || end.Exit == nil || end.Exit.Code != 3 {
		t.Fatalf("session after ready: %q %v, want x\\0y and exit 3", out, end)
	}
	list, err := a.Sessions(ctx, h)
	if err != nil || len(list) != 1 || list[0].State != adapter.SessionExited || list[0].Exit.Code != 3 || list[0].Stdout != 10 {
		t.Fatalf("Sessions = %+v %v", list, err)
	}
	if ex, err := a.TerminateSession(ctx, h, "s1", time.Second); err != nil || ex.Code != 3 {
		t.Fatalf("TerminateSession of the ended session = %v %v, want its exit 3", ex, err)
	}
	if n := srv.Requests("GET /v1/sprites/no-exit/exec"); n < 10 {
		t.Fatalf("only %d execs: the test did not exercise the quirk", n)
	}
}

// countExecs counts the exec upgrades whose argv had word.
func countExecs(srv *spritestest.Server, word string) int {
	n := 0
	for _, u := range srv.RequestURIs() {
		if strings.Contains(u, "/exec?") && strings.Contains(u, "cmd="+word+"&") {
			n++
		}
	}
	return n
}

// TestLostAnswers: a spawn whose answer (and exit) never arrived is run
// again with the same --id, and the sprite ends up with one session
// whose output appears once; a write whose answer never arrived is not
// run again: it is an uncertain unavailable, and its bytes arrived
// exactly once.
func TestLostAnswers(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{})
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "lost-answers")
	srv.CutExecs("spawn", 1)
	st, err := a.Spawn(ctx, h, adapter.Shell("echo ready; cat"), adapter.SpawnOptions{})
	if err != nil {
		t.Fatalf("Spawn whose first answer was lost = %v, want the session", err)
	}
	defer st.Close()
	if n := countExecs(srv, "spawn"); n != 2 {
		t.Fatalf("%d spawn execs, want 2 (the lost one, run again once)", n)
	}
	id := st.SessionID()
	readUntil(t, st, "ready\n")
	list, err := a.Sessions(ctx, h)
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("Sessions = %+v %v, want the one session %s", list, err, id)
	}

	srv.CutExecs("write", 1)
	err = a.WriteStdin(ctx, h, id, []byte("once\n"))
	var ue *adapter.UnavailableError
	if !errors.As(err, &ue) || !ue.Uncertain {
		t.Fatalf("WriteStdin whose answer was lost = %v, want an uncertain unavailable", err)
	}
	if n := countExecs(srv, "write"); n != 1 {
		t.Fatalf("%d write execs, want 1: a write is never run again", n)
	}
	if err := a.CloseStdin(ctx, h, id); err != nil {
		t.Fatal(err)
	}
	out, _, end := readAll(t, st)
	if string(out) != "once\n" || end.Exit == nil || end.Exit.Code != 0 {
		t.Fatalf("session after ready: %q %v, want the lost write's bytes exactly once", out, end)
	}
}

// TestDriverKilledMidAttach: hostedtest.DriverKilledMidAttach with ~30 %
// of execs closed without their exit frame.
func TestDriverKilledMidAttach(t *testing.T) {
	_, c := standIn(t, spritestest.Options{DropExit: spritestest.DropExitRandom, Seed: 7})
	hostedtest.DriverKilledMidAttach(t, hostedtest.Subject{
		New: func(t testing.TB) hostedtest.Adapter { return newAdapter(t, c, nil) }})
}

// TestUploadAndVerify: create uploads runner-shim (mode 0755, parents
// made) and verifies it; a binary of another version is refused at
// create with both versions named and the new sprite deleted; an
// existing sprite without runner-shim is adopted and gets it through the
// installer.
func TestUploadAndVerify(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{})
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "fresh")
	dir, _ := srv.Dir("fresh")
	if fi, err := os.Stat(filepath.Join(dir, sprites.DefaultShimPath)); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("uploaded runner-shim: %v %v, want mode 0755", fi, err)
	}
	if again, err := a.Create(ctx, "fresh", adapter.CreateOptions{}); err != nil || again != h {
		t.Fatalf("Create again = %v %v, want %v", again, err, h)
	}

	old := newAdapter(t, c, func(cfg *sprites.AdapterConfig) { cfg.ShimBinary = binary(shims.Old) })
	_, err := old.Create(ctx, "old-shim", adapter.CreateOptions{})
	var pe *adapter.ProviderError
	if !errors.As(err, &pe) || !strings.Contains(pe.Detail, "v0.0.0-old") || !strings.Contains(pe.Detail, shimVersion) {
		t.Fatalf("Create with a runner-shim of another version = %v, want a provider error naming both", err)
	}
	if _, err := a.Get(ctx, "old-shim"); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Get after the refused create = %v, want not_found (deleted)", err)
	}

	if _, err := c.Create(ctx, sprites.CreateRequest{Name: "bare"}); err != nil {
		t.Fatal(err)
	}
	hb, err := a.Create(ctx, "bare", adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("Create adopting a sprite without runner-shim = %v", err)
	}
	r, err := a.Exec(ctx, hb, adapter.Shell("echo hi"))
	if err != nil || string(r.Stdout) != "hi\n" {
		t.Fatalf("Exec in the adopted sprite = %q %v", r.Stdout, err)
	}
}

// TestIncarnations: a handle of a sprite deleted and created again under
// its name is not_found for sessions, and destroying it leaves the new
// sprite alone.
func TestIncarnations(t *testing.T) {
	_, c := standIn(t, spritestest.Options{})
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h1, err := a.Create(ctx, "reborn", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := newAdapter(t, c, nil)
	if err := other.Destroy(ctx, h1); err != nil {
		t.Fatal(err)
	}
	h2, err := other.Create(ctx, "reborn", adapter.CreateOptions{})
	if err != nil || h2.ID == h1.ID {
		t.Fatalf("Create again = %v %v, want a new incarnation", h2, err)
	}
	if _, err := a.Sessions(ctx, h1); !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Sessions of the old incarnation = %v, want not_found", err)
	}
	if err := a.Destroy(ctx, h1); err != nil {
		t.Fatalf("Destroy of the old incarnation = %v, want nil", err)
	}
	if got, err := a.Get(ctx, "reborn"); err != nil || !got.Same(h2) {
		t.Fatalf("Get after destroying the old handle = %v %v, want %v untouched", got, err, h2)
	}
}

// TestStdinNeverInURL: the bytes of WriteStdin travel in stdin frames,
// never in an exec URL's query (where argv goes), in any encoding.
func TestStdinNeverInURL(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{})
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "stdin-url")
	st, err := a.Spawn(ctx, h, adapter.Shell("echo ready; cat"), adapter.SpawnOptions{SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	readUntil(t, st, "ready\n")
	secret := []byte("sk-live-0123456789abcdef\n")
	if err := a.WriteStdin(ctx, h, "s", secret); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(ctx, h, "s"); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := readAll(t, st); string(out) != string(secret) {
		t.Fatalf("session read %q, want %q", out, secret)
	}
	b64 := base64.StdEncoding.EncodeToString(secret)
	for _, u := range srv.RequestURIs() {
		dec, _ := url.QueryUnescape(u)
		if strings.Contains(dec, "sk-live") || strings.Contains(dec, b64) {
			t.Fatalf("a request URI carries the stdin bytes: %s", u)
		}
	}
}

// stdinSession spawns cmd as session id, waits for its "ready\n", writes
// in to its stdin and closes it, and reads the session to its terminal
// frame. The caller closes st.
func stdinSession(t *testing.T, ctx context.Context, a adapter.Adapter, h adapter.Handle, id, cmd, in string) (st adapter.Stream, stdout []byte, end adapter.Frame) {
	t.Helper()
	st, err := a.Spawn(ctx, h, adapter.Shell(cmd), adapter.SpawnOptions{SessionID: id})
	if err != nil {
		t.Fatalf("Spawn = %v", err)
	}
	ok := false
	defer func() {
		if !ok { // a failed step: the caller never gets st to close
			st.Close()
		}
	}()
	readUntil(t, st, "ready\n")
	if err := a.WriteStdin(ctx, h, id, []byte(in)); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	if err := a.CloseStdin(ctx, h, id); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	stdout, _, end = readAll(t, st)
	ok = true
	return st, stdout, end
}
