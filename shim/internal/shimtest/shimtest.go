// Package shimtest is what the tests of the shim packages share: a test
// binary that is its own shim program (Run), and helpers that start
// sessions through shim/launch and wait for them with shim/sessiondir.
// Only tests import it.
package shimtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the shim: with this variable set, TestMain
// runs Main instead of the tests, so `go test ./shim/...` needs no build
// step.
const AsShimEnv = "RUNNER_SHIM_TEST_AS_SHIM"

var ShimExe []string

var TestEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C"}

// sessionDir returns a short session directory (socket paths are limited).
func SessionDir(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "shm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return filepath.Join(root, "s")
}

func CtxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// start starts a session in a fresh session directory and registers a
// cleanup that kills it if the test left it running and waits for its shim
// to exit (startAt).
func Start(t *testing.T, spec sessiondir.Spec) (string, sessiondir.Status) {
	t.Helper()
	dir := SessionDir(t)
	return dir, StartAt(t, dir, spec)
}

// waitGone waits until pid (a shim this test started) has exited. A
// zombie counts as gone: the shim is reparented to init, which may reap it
// late.
func WaitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		// A zombie leader whose other threads are gone has released
		// everything (files, locks).
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil &&
			bytes.Contains(b, []byte("State:\tZ")) && bytes.Contains(b, []byte("Threads:\t1\n")) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Errorf("shim %d still alive", pid)
}

// DialRaw opens a bare control connection to the shim of the session in
// dir, for tests that speak the protocol by hand (and leave it as a
// caller would); the caller closes it.
func DialRaw(t *testing.T, dir string) *net.UnixConn {
	t.Helper()
	sock, err := sessiondir.SocketPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func Dial(t *testing.T, dir string) *launch.Client {
	t.Helper()
	c, err := launch.Dial(CtxT(t, 5*time.Second), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitExit waits for the exit record through Terminate's wait-only path:
// ReadStatus until exited.
func WaitExit(t *testing.T, dir string) journal.Exit {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		st, err := sessiondir.ReadStatus(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == sessiondir.StateExited {
			return *st.Exit
		}
		if st.State == sessiondir.StateLost {
			t.Fatalf("session lost: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no exit record")
	return journal.Exit{}
}

// attachAll attaches from the cursors and returns each stream's bytes and
// the terminal frame.
func AttachAll(t *testing.T, dir string, opts sessiondir.AttachOptions) (map[wire.StreamID]*bytes.Buffer, wire.Frame) {
	t.Helper()
	out := map[wire.StreamID]*bytes.Buffer{wire.StreamStdout: {}, wire.StreamStderr: {}}
	next := map[wire.StreamID]int64{wire.StreamStdout: opts.Stdout, wire.StreamStderr: opts.Stderr}
	var term wire.Frame
	err := sessiondir.Attach(CtxT(t, 20*time.Second), dir, opts, func(b []byte) error {
		f, err := wire.ParseFrame(b)
		if err != nil {
			return err
		}
		if term.Kind != 0 {
			return fmt.Errorf("frame %s after the terminal frame", f.Kind)
		}
		switch {
		case f.Kind == wire.FrameData:
			if f.Offset != next[f.Stream] {
				return fmt.Errorf("stream %d: got offset %d, want %d", f.Stream, f.Offset, next[f.Stream])
			}
			next[f.Stream] = f.End()
			out[f.Stream].Write(f.Payload)
		case f.Kind.Terminal():
			term = f
			term.Payload = bytes.Clone(f.Payload)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if term.Kind == 0 {
		t.Fatal("attach returned without a terminal frame")
	}
	return out, term
}

// checkCat checks a session started on cat: its command runs (st.PID),
// takes stdin at once, and ends on close-stdin with the bytes echoed.
func CheckCat(t *testing.T, dir string, st sessiondir.Status) {
	t.Helper()
	if err := syscall.Kill(st.PID, 0); err != nil {
		t.Fatalf("command pid %d: %v", st.PID, err)
	}
	c := Dial(t, dir)
	ctx := CtxT(t, 10*time.Second)
	if err := c.WriteStdin(ctx, []byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if e := WaitExit(t, dir); e.Code != 0 || e.Lengths["stdout"] != 3 {
		t.Fatalf("got %+v, want exit 0 with 3 bytes", e)
	}
}

func ReadStream(dir, stream string) ([]byte, error) {
	j, err := journal.Open(filepath.Join(dir, sessiondir.JournalDir))
	if err != nil {
		return nil, err
	}
	defer j.Close()
	r, err := j.NewReader(stream, 0, false)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func StdoutOf(t *testing.T, dir string) string {
	t.Helper()
	b, err := ReadStream(dir, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// resolvFixture writes a resolv.conf with content unique to the test.
func ResolvFixture(t *testing.T) (path, content string) {
	t.Helper()
	content = fmt.Sprintf("# runner shim test %d\nnameserver 192.0.2.53\noptions edns0\n", time.Now().UnixNano())
	path = filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, content
}

func NeedRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "mount, setuid, network namespaces and cgroups; run the shim tests as root to cover this path")
	}
}

// newNetNS creates a network namespace bound to a file in t.TempDir(), the
// way `ip netns add` does, and removes it when the test ends. The thread
// that made it is switched back to the original namespace, or discarded
// if that fails.
func NewNetNS(t *testing.T) (path string, ino uint64) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	// Owned by newNetNS, which waits for it.
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		merr := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("restore netns: %w (thread discarded)", err)
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- merr
	}()
	if err := <-errc; err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount netns %s: %v", path, err)
		}
	})
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return path, st.Ino
}

// startAt is start with a caller-chosen session directory.
func StartAt(t *testing.T, dir string, spec sessiondir.Spec) sessiondir.Status {
	t.Helper()
	if spec.ID == "" {
		spec.ID = "t1"
	}
	if spec.Env == nil {
		spec.Env = TestEnv
	}
	st, err := ColdStart(CtxT(t, 10*time.Second), ShimExe, dir, spec)
	if err != nil {
		t.Fatalf("start %q: %v", spec.Argv, err)
	}
	t.Cleanup(func() {
		stop(t, dir, st.ShimPID)
		checkShimLog(t, dir)
	})
	return st
}

// newPool starts a pool of size and waits until it is full; Close is
// registered as cleanup.
func NewPool(t *testing.T, size int) *launch.Pool {
	t.Helper()
	p := launch.NewPool(ShimExe, launch.PoolOptions{Size: size, Root: PoolRoot(t)})
	t.Cleanup(func() { p.Close() })
	WaitWarm(t, p, size)
	return p
}

// poolRoot is a short root for a pool's session directories (a socket
// path must fit in 107 bytes), removed after the test.
func PoolRoot(t *testing.T) string {
	t.Helper()
	return filepath.Dir(SessionDir(t))
}

// poolDir returns a new session directory name in p's root.
func PoolDir(t *testing.T, p *launch.Pool) string {
	t.Helper()
	f, err := os.CreateTemp(p.Root(), "s")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	return f.Name()
}

// staged lists the staging directories left in root.
func Staged(t *testing.T, root string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(root, ".warm-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func WaitWarm(t *testing.T, p *launch.Pool, n int) []int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if pids := p.WarmPIDs(); len(pids) >= n {
			return pids
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pool: got %d warm shims, want %d", len(p.WarmPIDs()), n)
	return nil
}

// poolStart starts spec through p, checks that a warm shim took it, and
// registers the same cleanup as start.
func PoolStart(t *testing.T, p *launch.Pool, spec sessiondir.Spec) (string, sessiondir.Status) {
	t.Helper()
	warm := WaitWarm(t, p, 1)
	dir := PoolDir(t, p)
	if spec.ID == "" {
		spec.ID = "t1"
	}
	if spec.Env == nil {
		spec.Env = TestEnv
	}
	st, err := p.Start(CtxT(t, 10*time.Second), dir, spec)
	if err != nil {
		t.Fatalf("pool start %q: %v", spec.Argv, err)
	}
	if !slices.Contains(warm, st.ShimPID) {
		t.Fatalf("shim pid %d: want one of the warm shims %v", st.ShimPID, warm)
	}
	t.Cleanup(func() { stop(t, dir, st.ShimPID) })
	return dir, st
}

func ParentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// checkShimLog fails the test if the shim's own stderr (shim.log) reports
// a data race (the shim is this race-enabled test binary), a panic or a
// fatal runtime error: nothing else would ever show them.
func checkShimLog(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, sessiondir.LogFile))
	if err != nil {
		return
	}
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if bytes.Contains(b, []byte(bad)) {
			t.Errorf("shim.log reports %q:\n%s", bad, b)
			return
		}
	}
}

// Run is the TestMain of a package whose tests start shims: the test
// binary is its own shim program. Run in the environment AsShimEnv=1 it
// is the shim (shimMain, the supervisor's Main); with one of helpers'
// variables set it runs that helper; else it runs the tests with ShimExe
// naming itself. It returns the exit status.
func Run(m *testing.M, shimMain func(args []string) int, helpers map[string]func() int) int {
	if os.Getenv(AsShimEnv) == "1" {
		return shimMain(os.Args[1:])
	}
	for env, helper := range helpers {
		if os.Getenv(env) != "" {
			return helper()
		}
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ShimExe = []string{exe}
	os.Setenv(AsShimEnv, "1")
	if os.Getenv("GORACE") == "" {
		// Under -race every process sleeps 1 s before exiting by default,
		// which Start pays for the detaching intermediate.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	return m.Run()
}

// ColdStart starts a session in dir with a shim of exe started cold,
// through a pool of no warm shims (the one way a shim starts).
func ColdStart(ctx context.Context, exe []string, dir string, spec sessiondir.Spec) (sessiondir.Status, error) {
	p := launch.NewPool(exe, launch.PoolOptions{})
	defer p.Close()
	return p.Start(ctx, dir, spec)
}

// stop terminates the session in dir if the test left it running, and
// waits for its shim to exit.
func stop(t *testing.T, dir string, shimPID int) {
	if c, err := launch.Dial(CtxT(t, 5*time.Second), dir); err == nil {
		c.Terminate(CtxT(t, 10*time.Second), 100*time.Millisecond)
		c.Close()
	}
	WaitGone(t, shimPID)
}
