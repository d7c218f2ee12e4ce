package guest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

const testVersion = "v0.0.0-guest-test"

// read and readUntil read a stream as every hosted provider's tests do.
var read, readUntil = hostedtest.Collect, hostedtest.ReadUntil

var (
	shimDir    string // holds runner-shim (testVersion) and runner-shim-old
	buildError error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "guestbin")
	if err != nil {
		panic(err)
	}
	shimDir = dir
	for name, v := range map[string]string{"runner-shim": testVersion, "runner-shim-old": "v0.0.0-old"} {
		out, err := exec.Command("go", "build", "-ldflags", "-X github.com/agentrunner/runner/version.Version="+v,
			"-o", filepath.Join(dir, name), "github.com/agentrunner/runner/cmd/runner-shim").CombinedOutput()
		if err != nil {
			buildError = fmt.Errorf("build runner-shim: %v\n%s", err, out)
			break
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// localExec is an Executor that runs argv as real local processes: the
// provider primitive with the provider taken away. Programs without a
// slash are looked up in bin only (the "guest's PATH").
type localExec struct {
	bin string
	// attaches counts runner-shim attach executions.
	attaches atomic.Int64
	// killAttachAfter, when positive, SIGKILLs every attach execution once
	// it wrote that many bytes (a transport that drops mid-stream).
	killAttachAfter int64
	// down makes every Exec fail as a transport failure.
	down atomic.Bool
}

func (l *localExec) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, lifetime time.Duration) (int, error) {
	if l.down.Load() {
		return 0, &adapter.UnavailableError{Detail: "local: down"}
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		path = filepath.Join(l.bin, path)
	}
	if _, err := os.Stat(path); err != nil {
		return 127, nil
	}
	if lifetime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lifetime)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, path, argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}
	cmd.Stdin = stdin
	cw := &killWriter{w: stdout, after: -1}
	isAttach := len(argv) > 3 && argv[3] == "attach"
	if isAttach {
		l.attaches.Add(1)
		if l.killAttachAfter > 0 {
			cw.after = l.killAttachAfter
		}
	}
	cmd.Stdout = cw
	if err := cmd.Start(); err != nil {
		return 126, nil
	}
	cw.mu.Lock()
	cw.proc = cmd.Process
	cw.mu.Unlock()
	err := cmd.Wait()
	if ctx.Err() != nil {
		return -1, &adapter.UnavailableError{Detail: "local: " + ctx.Err().Error()}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, &adapter.UnavailableError{Detail: "local: " + err.Error()}
	}
	return 0, nil
}

// killWriter kills its process once after bytes went through.
type killWriter struct {
	w     io.Writer
	after int64
	n     int64
	mu    sync.Mutex
	proc  *os.Process
}

func (k *killWriter) Write(p []byte) (int, error) {
	n, err := k.w.Write(p)
	k.n += int64(n)
	if k.after >= 0 && k.n >= k.after {
		k.mu.Lock()
		if k.proc != nil {
			k.proc.Signal(syscall.SIGKILL) // the attach process this executor started
		}
		k.mu.Unlock()
		return n, errors.New("cut")
	}
	return n, err
}

type fixture struct {
	g    *guest.Guest
	ex   *localExec
	root string
}

func newGuest(t *testing.T, mod func(*guest.Config, *localExec)) *fixture {
	t.Helper()
	if buildError != nil {
		t.Fatal(buildError)
	}
	root, err := os.MkdirTemp("", "gr")
	if err != nil {
		t.Fatal(err)
	}
	ex := &localExec{bin: shimDir}
	cfg := guest.Config{Provider: "local", Exec: ex, Shim: "runner-shim", Root: filepath.Join(root, "s"), Version: testVersion,
		Lease: 2 * time.Second, Heartbeat: 200 * time.Millisecond, ReattachWindow: 10 * time.Second}
	if mod != nil {
		mod(&cfg, ex)
	}
	g, err := guest.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Stop every session this test started, then the guest.
		ex.down.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if list, err := g.Sessions(ctx); err == nil {
			for _, s := range list {
				if s.State == adapter.SessionRunning {
					g.Terminate(ctx, s.ID, 100*time.Millisecond)
				}
			}
		}
		g.Close()
		os.RemoveAll(root)
	})
	return &fixture{g: g, ex: ex, root: root}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSpawnStdinExit(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	st, err := fx.g.Spawn(ctx, adapter.Shell("echo ready; cat; echo bye >&2; exit 7"), adapter.SpawnOptions{SessionID: "one"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Written right after Spawn returns: never lost (the spawn-ack).
	if err := fx.g.WriteStdin(ctx, "one", []byte("a\x00b\n")); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB: through stdin lines
	if err := fx.g.WriteStdin(ctx, "one", big); err != nil {
		t.Fatal(err)
	}
	if err := fx.g.CloseStdin(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	out, errb, end := read(t, st)
	want := append([]byte("ready\na\x00b\n"), big...)
	if !bytes.Equal(out, want) || string(errb) != "bye\n" {
		t.Fatalf("stdout %d bytes (%q...), stderr %q", len(out), out[:min(len(out), 20)], errb)
	}
	if end.Exit == nil || end.Exit.Code != 7 || end.Exit.Reason != adapter.ReasonExited {
		t.Fatalf("end %v, want exit 7", end)
	}
	if err := fx.g.WriteStdin(ctx, "one", []byte("late")); !errors.Is(err, adapter.ErrCommandExited) {
		t.Fatalf("write after exit = %v, want command_exited", err)
	}
	if err := fx.g.CloseStdin(ctx, "one"); !errors.Is(err, adapter.ErrCommandExited) {
		t.Fatalf("close-stdin after exit = %v, want command_exited", err)
	}
}

func TestSpawnIdempotent(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	c := adapter.Shell("echo ready; cat")
	st1, err := fx.g.Spawn(ctx, c, adapter.SpawnOptions{SessionID: "idem"})
	if err != nil {
		t.Fatal(err)
	}
	defer st1.Close()
	readUntil(t, st1, "ready")
	st2, err := fx.g.Spawn(ctx, c, adapter.SpawnOptions{SessionID: "idem"})
	if err != nil {
		t.Fatalf("second spawn of the same request = %v", err)
	}
	defer st2.Close()
	readUntil(t, st2, "ready")
	if _, err := fx.g.Spawn(ctx, adapter.Shell("true"), adapter.SpawnOptions{SessionID: "idem"}); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("spawn of the id with another command = %v, want invalid", err)
	}
	list, err := fx.g.Sessions(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("Sessions = %v %v, want one session", list, err)
	}
}

func TestErrors(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	st, err := fx.g.Spawn(ctx, adapter.Shell("printf 12345"), adapter.SpawnOptions{SessionID: "done"})
	if err != nil {
		t.Fatal(err)
	}
	read(t, st)
	st.Close()
	st, err = fx.g.Spawn(ctx, adapter.Shell("echo ready; exec sleep 60"), adapter.SpawnOptions{SessionID: "running"})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, st, "ready")
	st.Close()
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"attach to an unknown session", func() error { _, err := fx.g.Attach(ctx, "nope", adapter.Cursor{}); return err }, adapter.ErrNotFound},
		{"attach beyond the end", func() error { _, err := fx.g.Attach(ctx, "done", adapter.Cursor{Stdout: 6}); return err }, adapter.ErrInvalid},
		{"write to an unknown session", func() error { return fx.g.WriteStdin(ctx, "nope", []byte("x")) }, adapter.ErrNotFound},
		{"close-stdin of an unknown session", func() error { return fx.g.CloseStdin(ctx, "nope") }, adapter.ErrNotFound},
		{"terminate of an unknown session", func() error { _, err := fx.g.Terminate(ctx, "nope", time.Second); return err }, adapter.ErrNotFound},
		{"signal of an unknown session", func() error { return fx.g.Signal(ctx, "nope", "TERM") }, adapter.ErrNotFound},
		{"resize of a pipes session", func() error { return fx.g.Resize(ctx, "running", adapter.TTYSize{Rows: 5, Cols: 5}) }, adapter.ErrInvalid},
		{"spawn of a missing program", func() error {
			_, err := fx.g.Spawn(ctx, adapter.Command{Path: "no-such-program-x"}, adapter.SpawnOptions{})
			return err
		}, adapter.ErrInvalid},
		{"grace out of range", func() error { _, err := fx.g.Terminate(ctx, "done", time.Hour); return err }, adapter.ErrInvalid},
	} {
		if err := tc.call(); !errors.Is(err, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, err, tc.want)
		}
	}
	// A transport failure proves nothing: unavailable, and uncertain for
	// a call that may have taken effect.
	fx.ex.down.Store(true)
	err = fx.g.WriteStdin(ctx, "done", []byte("x"))
	var ue *adapter.UnavailableError
	if !errors.As(err, &ue) || !ue.Uncertain {
		t.Errorf("write with the transport down = %#v, want unavailable, uncertain", err)
	}
	if _, err := fx.g.Attach(ctx, "done", adapter.Cursor{}); !errors.Is(err, adapter.ErrUnavailable) {
		t.Errorf("attach with the transport down = %v, want unavailable", err)
	}
}

func TestExec(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	r, err := fx.g.Exec(ctx, adapter.Shell("echo out; echo err >&2; exit 3"))
	if err != nil || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" || r.Exit.Code != 3 {
		t.Fatalf("Exec = %q %q %v %v", r.Stdout, r.Stderr, r.Exit, err)
	}
	r, err = fx.g.Exec(ctx, adapter.Command{Path: "no-such-program-x"})
	if err != nil || r.Exit.Code != 127 || r.Exit.Reason != adapter.ReasonExited {
		t.Fatalf("Exec of a missing program = %v %v, want exit 127", r.Exit, err)
	}
	r, err = fx.g.Exec(ctx, adapter.Command{Path: "/etc/hostname"})
	if err != nil || r.Exit.Code != 126 {
		t.Fatalf("Exec of a file that is not executable = %v %v, want exit 126", r.Exit, err)
	}
	if _, err := fx.g.Exec(ctx, adapter.Command{}); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("Exec of nothing = %v, want invalid", err)
	}
	// Exec's sessions are not the sandbox's spawned sessions.
	if list, err := fx.g.Sessions(ctx); err != nil || len(list) != 0 {
		t.Fatalf("Sessions after execs = %v %v, want none", list, err)
	}
	// A context that ends stops the command.
	marker := filepath.Join(fx.root, "pid")
	cctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	_, err = fx.g.Exec(cctx, adapter.Shell("echo $$ > "+marker+"; exec sleep 60"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec past its context = %v, want deadline exceeded", err)
	}
	b, rerr := os.ReadFile(marker)
	if rerr != nil {
		t.Fatal(rerr)
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		syscall.Kill(pid, syscall.SIGKILL) // the sleep this test started
		t.Fatalf("the command of an Exec whose context ended still runs (kill 0: %v)", err)
	}
}

func TestSessionsTerminate(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	for _, s := range []struct{ id, script string }{{"zz", "printf abc"}, {"aa", "echo ready; exec sleep 60"}} {
		st, err := fx.g.Spawn(ctx, adapter.Shell(s.script), adapter.SpawnOptions{SessionID: s.id})
		if err != nil {
			t.Fatal(err)
		}
		if s.id == "aa" {
			readUntil(t, st, "ready")
		} else {
			read(t, st)
		}
		st.Close()
	}
	list, err := fx.g.Sessions(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("Sessions = %v %v", list, err)
	}
	if list[0].ID != "zz" || list[0].State != adapter.SessionExited || list[0].Stdout != 3 || list[0].Exit == nil || list[0].Exit.Code != 0 ||
		list[0].Command.Path != "sh" || strings.Join(list[0].Command.Args, " ") != "-c printf abc" {
		t.Errorf("Sessions[0] = %+v", list[0])
	}
	if list[1].ID != "aa" || list[1].State != adapter.SessionRunning || list[1].Stdout != 6 {
		t.Errorf("Sessions[1] = %+v", list[1])
	}
	ex, err := fx.g.Terminate(ctx, "aa", 200*time.Millisecond)
	if err != nil || ex.Reason != adapter.ReasonTerminated || ex.Signal != "SIGTERM" {
		t.Fatalf("Terminate = %v %v, want terminated by SIGTERM", ex, err)
	}
	again, err := fx.g.Terminate(ctx, "aa", 200*time.Millisecond)
	if err != nil || again != ex {
		t.Fatalf("Terminate again = %v %v, want the recorded %v", again, err, ex)
	}
}

// TestLeaseReattach: attaches are bounded by their lease in the guest, and
// the stream goes on across lease ends byte-exactly, with one terminal
// frame.
func TestLeaseReattach(t *testing.T) {
	fx := newGuest(t, func(c *guest.Config, _ *localExec) { c.Lease = 300 * time.Millisecond })
	ctx := ctxT(t)
	st, err := fx.g.Spawn(ctx, adapter.Shell(`i=0; while [ $i -lt 20 ]; do echo line $i; i=$((i+1)); sleep 0.1; done`), adapter.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	out, _, end := read(t, st)
	var want strings.Builder
	for i := range 20 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if string(out) != want.String() || end.Exit == nil || end.Exit.Code != 0 {
		t.Fatalf("stdout %q end %v", out, end)
	}
	if n := fx.ex.attaches.Load(); n < 4 {
		t.Fatalf("%d attach executions for 2s of output under a 300ms lease, want several", n)
	}
	select {
	case f, ok := <-st.Frames():
		if ok {
			t.Fatalf("a frame after the terminal one: %v", f)
		}
	case <-time.After(time.Second):
	}
}

// TestCutMidAttach: every attach execution is killed mid-stream (a
// transport that drops); the stream reattaches from its cursor and the
// bytes are exact, in binary and in text-safe mode.
func TestCutMidAttach(t *testing.T) {
	for _, text := range []bool{false, true} {
		t.Run(fmt.Sprintf("text=%v", text), func(t *testing.T) {
			fx := newGuest(t, func(c *guest.Config, ex *localExec) { c.TextSafe = text; ex.killAttachAfter = 200 << 10 })
			ctx := ctxT(t)
			st, err := fx.g.Spawn(ctx, adapter.Shell(`head -c 1500000 /dev/urandom | od -An -v -tx1; echo e >&2`), adapter.SpawnOptions{SessionID: "big"})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			out, errb, end := read(t, st)
			if end.Exit == nil || end.Exit.Code != 0 || string(errb) != "e\n" {
				t.Fatalf("end %v stderr %q", end, errb)
			}
			whole, err := os.ReadFile(filepath.Join(fx.root, "s", "big", "journal", "stdout", "00000000000000000000.seg"))
			if err != nil {
				t.Fatal(err)
			}
			if sha256.Sum256(out) != sha256.Sum256(whole) || len(out) != len(whole) {
				t.Fatalf("read %d bytes across cuts, the journal holds %d; they differ", len(out), len(whole))
			}
			if n := fx.ex.attaches.Load(); n < 3 {
				t.Fatalf("%d attach executions, want the cuts to have forced several", n)
			}
		})
	}
}

// TestDriverKilledResumes: the driver goes away mid-attach (its Guest
// closed, as when the control plane restarts); a new Guest attaches from
// the cursor the first one reached and the two reads are the session's
// bytes exactly.
func TestDriverKilledResumes(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	st, err := fx.g.Spawn(ctx, adapter.Shell(`echo ready; cat`), adapter.SpawnOptions{SessionID: "live"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		fx.g.WriteStdin(ctx, "live", []byte(fmt.Sprintf("first %d\n", i)))
	}
	got := readUntil(t, st, "first 49\n")
	fx.g.Close() // the driver dies; its attach executions stop
	g2, err := guest.New(guest.Config{Provider: "local", Exec: fx.ex, Root: filepath.Join(fx.root, "s"), Version: testVersion, Heartbeat: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	st2, err := g2.Attach(ctx, "live", adapter.Cursor{Stdout: int64(len(got))})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	for i := range 50 {
		g2.WriteStdin(ctx, "live", []byte(fmt.Sprintf("second %d\n", i)))
	}
	if err := g2.CloseStdin(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	rest, _, end := read(t, st2)
	var want strings.Builder
	want.WriteString("ready\n")
	for i := range 50 {
		fmt.Fprintf(&want, "first %d\n", i)
	}
	for i := range 50 {
		fmt.Fprintf(&want, "second %d\n", i)
	}
	if string(got)+string(rest) != want.String() || end.Exit == nil || end.Exit.Code != 0 {
		t.Fatalf("read %q + %q (end %v), want %q", got, rest, end, want.String())
	}
}

// TestVerify: a guest without runner-shim gets it installed once, even
// under concurrent first calls; a guest with another version is refused,
// clearly; without an installer a missing shim is refused.
func TestVerify(t *testing.T) {
	t.Run("install once", func(t *testing.T) {
		empty := t.TempDir()
		var installs atomic.Int64
		fx := newGuest(t, func(c *guest.Config, ex *localExec) {
			ex.bin = empty
			c.Install = func(ctx context.Context) error {
				installs.Add(1)
				b, err := os.ReadFile(filepath.Join(shimDir, "runner-shim"))
				if err != nil {
					return err
				}
				return os.WriteFile(filepath.Join(empty, "runner-shim"), b, 0o755)
			}
		})
		ctx := ctxT(t)
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = fx.g.Exec(ctx, adapter.Shell("true"))
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("Exec = %v", err)
			}
		}
		if n := installs.Load(); n != 1 {
			t.Fatalf("%d installs, want 1", n)
		}
	})
	t.Run("mismatch refused", func(t *testing.T) {
		fx := newGuest(t, func(c *guest.Config, _ *localExec) { c.Shim = "runner-shim-old" })
		_, err := fx.g.Exec(ctxT(t), adapter.Shell("true"))
		var pe *adapter.ProviderError
		if !errors.As(err, &pe) || !strings.Contains(pe.Detail, `"v0.0.0-old"`) || !strings.Contains(pe.Detail, testVersion) {
			t.Fatalf("Exec with an old guest shim = %v, want a provider error naming both versions", err)
		}
		if _, err := fx.g.Sessions(ctxT(t)); !errors.As(err, &pe) {
			t.Fatalf("Sessions after a refusal = %v, want refused again", err)
		}
	})
	t.Run("missing without installer", func(t *testing.T) {
		fx := newGuest(t, func(c *guest.Config, ex *localExec) { ex.bin = t.TempDir() })
		_, err := fx.g.Exec(ctxT(t), adapter.Shell("true"))
		var pe *adapter.ProviderError
		if !errors.As(err, &pe) || !strings.Contains(pe.Detail, "not found in the guest") {
			t.Fatalf("Exec without a guest shim = %v, want a provider error", err)
		}
	})
}

func TestTTY(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	st, err := fx.g.Spawn(ctx, adapter.Shell(`stty size; read x; echo got $x; stty size`), adapter.SpawnOptions{TTY: &adapter.TTYSize{Rows: 30, Cols: 100}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	readUntil(t, st, "30 100")
	id := st.SessionID()
	if err := fx.g.Resize(ctx, id, adapter.TTYSize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	if err := fx.g.WriteStdin(ctx, id, []byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	out, _, end := read(t, st)
	if !strings.Contains(string(out), "got hi") || !strings.Contains(string(out), "40 120") || end.Exit == nil || end.Exit.Code != 0 {
		t.Fatalf("tty output %q end %v", out, end)
	}
}
