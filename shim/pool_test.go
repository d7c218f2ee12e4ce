package shim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// newPool starts a pool of size and waits until it is full; Close is
// registered as cleanup.
func newPool(t *testing.T, size int) *launch.Pool {
	t.Helper()
	p := launch.NewPool(shimExe, launch.PoolOptions{Size: size, Root: poolRoot(t)})
	t.Cleanup(func() { p.Close() })
	waitWarm(t, p, size)
	return p
}

// poolRoot is a short root for a pool's session directories (a socket
// path must fit in 107 bytes), removed after the test.
func poolRoot(t *testing.T) string {
	t.Helper()
	return filepath.Dir(sessionDir(t))
}

// startCold starts spec in dir through p and checks that no warm shim of
// warm took it; it waits for the command's end and the shim's exit.
func startCold(t *testing.T, p *launch.Pool, dir string, spec sessiondir.Spec, warm []int) {
	t.Helper()
	st, err := p.Start(ctxT(t, 10*time.Second), dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(warm, st.ShimPID) {
		t.Errorf("warm shim %d took a start that must be cold", st.ShimPID)
	}
	waitExit(t, dir)
	waitGone(t, st.ShimPID)
}

// poolDir returns a new session directory name in p's root.
func poolDir(t *testing.T, p *launch.Pool) string {
	t.Helper()
	f, err := os.CreateTemp(p.Opts.Root, "s")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	return f.Name()
}

// staged lists the staging directories left in root.
func staged(t *testing.T, root string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(root, ".warm-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func waitWarm(t *testing.T, p *launch.Pool, n int) []int {
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
func poolStart(t *testing.T, p *launch.Pool, spec sessiondir.Spec) (string, sessiondir.Status) {
	t.Helper()
	warm := waitWarm(t, p, 1)
	dir := poolDir(t, p)
	if spec.ID == "" {
		spec.ID = "t1"
	}
	if spec.Env == nil {
		spec.Env = testEnv
	}
	st, err := p.Start(ctxT(t, 10*time.Second), dir, spec)
	if err != nil {
		t.Fatalf("pool start %q: %v", spec.Argv, err)
	}
	if !slices.Contains(warm, st.ShimPID) {
		t.Fatalf("shim pid %d: want one of the warm shims %v", st.ShimPID, warm)
	}
	t.Cleanup(func() {
		if c, err := launch.Dial(ctxT(t, 5*time.Second), dir); err == nil {
			c.Terminate(ctxT(t, 10*time.Second), 100*time.Millisecond)
			c.Close()
		}
		waitGone(t, st.ShimPID)
	})
	return dir, st
}

func TestPoolStart(t *testing.T) {
	p := newPool(t, 2)

	t.Run("exit code", func(t *testing.T) {
		dir, _ := poolStart(t, p, sessiondir.Spec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
		if e := waitExit(t, dir); e.Reason != journal.ReasonExited || e.Code != 3 || e.Lengths["stdout"] != 4 || e.Lengths["stderr"] != 4 {
			t.Fatalf("got %+v, want exited 3 with lengths 4/4", e)
		}
		if b, err := os.ReadFile(dir + "/" + sessiondir.LogFile); err != nil || len(b) != 0 {
			t.Errorf("shim.log: got %q %v, want an empty log", b, err)
		}
	})

	t.Run("runs before return", func(t *testing.T) {
		dir, st := poolStart(t, p, sessiondir.Spec{Argv: []string{"cat"}})
		if sid, _ := unix.Getsid(st.ShimPID); sid != st.ShimPID {
			t.Errorf("shim %d: session %d, want its own", st.ShimPID, sid)
		}
		if ppid := parentOf(t, st.ShimPID); ppid == os.Getpid() {
			t.Errorf("shim %d is a child of the test process", st.ShimPID)
		}
		checkCat(t, dir, st)
	})

	t.Run("missing binary", func(t *testing.T) {
		warm := waitWarm(t, p, 1)
		dir := poolDir(t, p)
		_, err := p.Start(ctxT(t, 10*time.Second), dir, sessiondir.Spec{ID: "x", Argv: []string{"/nonexistent/bin"}, Env: testEnv})
		var se *launch.StartError
		if !errors.As(err, &se) || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("got %v, want a StartError matching fs.ErrNotExist", err)
		}
		if !slices.Contains(warm, se.ShimPID) {
			t.Errorf("shim pid %d: want one of the warm shims %v", se.ShimPID, warm)
		}
		waitGone(t, se.ShimPID)
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("session dir left behind: %v", err)
		}
	})

	t.Run("tty", func(t *testing.T) {
		dir, _ := poolStart(t, p, sessiondir.Spec{TTY: true, Rows: 30, Cols: 100, Argv: []string{"sh", "-c", `tty >/dev/null && echo "is a tty"; stty size`}})
		if e := waitExit(t, dir); e.Code != 0 {
			t.Fatalf("got %+v, want exit 0", e)
		}
		out, _ := attachAll(t, dir, sessiondir.AttachOptions{})
		if got := out[wire.StreamStdout].String(); got != "is a tty\r\n30 100\r\n" {
			t.Errorf("stdout: got %q", got)
		}
	})

	t.Run("netns", func(t *testing.T) {
		needRoot(t)
		nsPath, ino := newNetNS(t)
		conf, content := resolvFixture(t)
		dir, st := poolStart(t, p, sessiondir.Spec{Argv: []string{"sh", "-c", "cat /etc/resolv.conf; readlink /proc/self/ns/net"}, NetNS: nsPath, ResolvConf: conf})
		if e := waitExit(t, dir); e.Code != 0 {
			t.Fatalf("got %+v, want exit 0", e)
		}
		if got, want := stdoutOf(t, dir), fmt.Sprintf("%snet:[%d]\n", content, ino); got != want {
			t.Errorf("pid %d: got %q, want %q", st.PID, got, want)
		}
	})
}

func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

func TestPoolCloseStopsWarmShims(t *testing.T) {
	root := poolRoot(t)
	p := launch.NewPool(shimExe, launch.PoolOptions{Size: 3, Root: root})
	pids := waitWarm(t, p, 3)
	if got := staged(t, root); len(got) != 3 {
		t.Fatalf("staging directories: got %q, want one per warm shim", got)
	}
	p.Close()
	// Close returns once every idle warm shim has removed its staging
	// directory (a stopping runnerd leaves none behind).
	if got := staged(t, root); len(got) != 0 {
		t.Errorf("staging directories left after Close: %q", got)
	}
	p.Close() // idempotent
	for _, pid := range pids {
		waitGone(t, pid)
	}
	// A closed pool still starts, cold.
	startCold(t, p, sessionDir(t), sessiondir.Spec{ID: "c", Argv: []string{"true"}, Env: testEnv}, pids)
}

func TestPoolRefills(t *testing.T) {
	p := newPool(t, 1)
	first := waitWarm(t, p, 1)
	poolStart(t, p, sessiondir.Spec{Argv: []string{"true"}})
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if pids := p.WarmPIDs(); len(pids) == 1 && pids[0] != first[0] {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pool not refilled: %v", p.WarmPIDs())
}

// A warm shim killed while idle is skipped, not handed the session.
func TestPoolSkipsDeadWarmShim(t *testing.T) {
	p := newPool(t, 2)
	pids := p.WarmPIDs()
	p.Mu.Lock()
	deadStage := p.Idle[0].Stage
	p.Mu.Unlock()
	syscall.Kill(pids[0], syscall.SIGKILL)
	waitGone(t, pids[0])
	dir, st := poolStart(t, p, sessiondir.Spec{Argv: []string{"true"}})
	if st.ShimPID != pids[1] {
		t.Errorf("shim pid %d: want the live warm shim %d", st.ShimPID, pids[1])
	}
	if _, err := os.Stat(deadStage); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dead warm shim's staging directory %s: %v, want it removed", deadStage, err)
	}
	waitExit(t, dir)
}

// poolHelperEnv makes the test binary a pool owner that is killed by the
// test: "idle" keeps a full pool, "take DIR" starts a session through it.
// It prints "warm PIDS" and, for take, "ok SHIMPID", then sleeps.
const poolHelperEnv = "RUNNER_SHIM_TEST_POOL"

// poolHelperRootEnv names the helper's pool root.
const poolHelperRootEnv = "RUNNER_SHIM_TEST_POOL_ROOT"

func poolHelper() int {
	exe, _ := os.Executable()
	os.Setenv(asShimEnv, "1")
	p := launch.NewPool([]string{exe}, launch.PoolOptions{Size: 2, Root: os.Getenv(poolHelperRootEnv)})
	deadline := time.Now().Add(15 * time.Second)
	for len(p.WarmPIDs()) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("warm", strings.Trim(fmt.Sprint(p.WarmPIDs()), "[]"))
	if dir, ok := strings.CutPrefix(os.Getenv(poolHelperEnv), "take "); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := p.Start(ctx, dir, sessiondir.Spec{ID: "survivor", Env: testEnv,
			Argv: []string{"sh", "-c", `echo started; read x; echo "got $x"; exit 42`}})
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("ok", st.ShimPID)
	}
	time.Sleep(time.Minute)
	return 0
}

// runPoolHelper starts poolHelper with mode and returns it and its lines
// once it printed want lines.
func runPoolHelper(t *testing.T, root, mode string, want int) (*exec.Cmd, [][]string) {
	t.Helper()
	exe, _ := os.Executable()
	helper := exec.Command(exe)
	helper.Env = append(os.Environ(), poolHelperEnv+"="+mode, poolHelperRootEnv+"="+root, asShimEnv+"=0")
	stdout, _ := helper.StdoutPipe()
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	sc := bufio.NewScanner(stdout)
	var lines [][]string
	for len(lines) < want && sc.Scan() {
		lines = append(lines, strings.Fields(sc.Text()))
	}
	if len(lines) < want || lines[0][0] != "warm" || len(lines[0]) != 3 {
		t.Fatalf("helper: got %q", lines)
	}
	return helper, lines
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWarmShimsExitWithTheirOwner(t *testing.T) {
	root := poolRoot(t)
	helper, lines := runPoolHelper(t, root, "idle", 1)
	pids := []int{atoi(t, lines[0][1]), atoi(t, lines[0][2])}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("warm shim %d: %v", pid, err)
		}
	}
	helper.Process.Kill() // kill -9 of the pool's owner
	helper.Wait()
	for _, pid := range pids {
		waitGone(t, pid)
	}
	if got := staged(t, root); len(got) != 0 {
		t.Errorf("staging directories left after the warm shims exited: %q", got)
	}
}

func TestTakenShimSurvivesOwnerKill(t *testing.T) {
	dir := sessionDir(t)
	helper, lines := runPoolHelper(t, filepath.Dir(dir), "take "+dir, 2)
	warm := []int{atoi(t, lines[0][1]), atoi(t, lines[0][2])}
	if lines[1][0] != "ok" {
		t.Fatalf("helper: %q", lines[1])
	}
	shimPID := atoi(t, lines[1][1])
	if !slices.Contains(warm, shimPID) {
		t.Fatalf("shim %d: want one of the warm shims %v", shimPID, warm)
	}
	helper.Process.Kill()
	helper.Wait()
	t.Cleanup(func() { waitGone(t, shimPID) })
	for _, pid := range warm {
		if pid != shimPID {
			waitGone(t, pid) // the other, still warm, exits
		}
	}
	st, err := sessiondir.ReadStatus(dir)
	if err != nil || st.State != sessiondir.StateRunning || st.ShimPID != shimPID {
		t.Fatalf("after the owner died: got %+v %v, want running under shim %d", st, err, shimPID)
	}
	c := dial(t, dir)
	if err := c.WriteStdin(ctxT(t, 10*time.Second), []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	out, term := attachAll(t, dir, sessiondir.AttachOptions{})
	if got := out[wire.StreamStdout].String(); got != "started\ngot hello\n" {
		t.Fatalf("stdout: got %q", got)
	}
	if e, err := term.Exit(); err != nil || term.Kind != wire.FrameExit || e.Code != 42 {
		t.Fatalf("terminal: got %s %+v %v, want exit 42", term.Kind, e, err)
	}
}

// TestWarmShimIgnoresPartialLine: a warm shim whose socket reaches EOF
// before both of its lines are complete (the pool died mid-write) exits 0,
// removes its staging directory and makes no session directory, whatever
// bytes it got.
func TestWarmShimIgnoresPartialLine(t *testing.T) {
	root := poolRoot(t)
	dir := filepath.Join(root, "s1")
	tests := []struct {
		name string
		sent string
	}{
		{"nothing", ""},
		{"a directory without its newline", dir},
		{"a directory line only", dir + "\n"},
		{"a directory and part of the spec", dir + "\n" + `{"id":"x","argv":["true"]`},
		{"a line too long", strings.Repeat("/x", 4096) + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			ours, theirs := os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs")
			defer ours.Close()
			cmd := exec.Command(shimExe[0], append(slices.Clone(shimExe[1:]), "--warm-fd=3", "--warm-root="+root)...)
			cmd.ExtraFiles = []*os.File{theirs}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			theirs.Close()
			line, err := bufio.NewReader(ours).ReadString('\n')
			got := staged(t, root)
			if len(got) != 1 {
				t.Fatalf("staging directories of a warm shim: got %q, want one", got)
			}
			if want := fmt.Sprintf("warm %d %s\n", cmd.Process.Pid, got[0]); err != nil || line != want {
				t.Fatalf("got %q, %v, want %q", line, err, want)
			}
			ours.WriteString(tt.sent)
			unix.Shutdown(fds[0], unix.SHUT_WR)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("warm shim: got %v, want exit 0", err)
			}
			if ents, _ := os.ReadDir(root); len(ents) != 0 {
				t.Fatalf("it left %d entries in its root (%v), want none", len(ents), ents)
			}
		})
	}
}

// TestPoolStagedSession: a start through a warm shim moves the staging
// directory it prepared into place: the session directory holds the spec,
// the shim's pid and a journal with the spec's streams (a TTY's journal
// is made on start, having one stream), and only the refill's staging
// directory is left in the root.
func TestPoolStagedSession(t *testing.T) {
	p := newPool(t, 1)
	for _, tty := range []bool{false, true} {
		dir, st := poolStart(t, p, sessiondir.Spec{ID: "st", TTY: tty, Argv: []string{"echo", "hi"}})
		if e := waitExit(t, dir); e.Reason != journal.ReasonExited || e.Code != 0 {
			t.Fatalf("tty %v: got %+v, want exited 0", tty, e)
		}
		var spec sessiondir.Spec
		if err := sessiondir.ReadJSON(filepath.Join(dir, sessiondir.SpecFile), &spec); err != nil || spec.ID != "st" || spec.TTY != tty || !slices.Equal(spec.Argv, []string{"echo", "hi"}) {
			t.Errorf("tty %v: spec.json: got %+v %v", tty, spec, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, sessiondir.PIDFile)); err != nil || string(b) != fmt.Sprintf("%d\n", st.ShimPID) {
			t.Errorf("tty %v: shim.pid: got %q %v, want %d", tty, b, err, st.ShimPID)
		}
		j, err := journal.Open(filepath.Join(dir, sessiondir.JournalDir))
		if err != nil {
			t.Fatal(err)
		}
		if got := j.Streams(); !slices.Equal(got, spec.Streams()) {
			t.Errorf("tty %v: journal streams %q, want %q", tty, got, spec.Streams())
		}
		j.Close()
		want := "hi\n"
		if tty {
			want = "hi\r\n"
		}
		if got := stdoutOf(t, dir); got != want {
			t.Errorf("tty %v: stdout %q, want %q", tty, got, want)
		}
	}
	waitWarm(t, p, 1)
	if got := staged(t, p.Opts.Root); len(got) != 1 {
		t.Errorf("staging directories: got %q, want only the refill's", got)
	}
}

// TestPoolExistingDirStartsCold: a warm shim makes its session directory
// by rename, so a directory that exists is started cold, by Start's rules
// (a second start of it is ErrExists), and the warm shim stays idle.
func TestPoolExistingDirStartsCold(t *testing.T) {
	p := newPool(t, 1)
	warm := waitWarm(t, p, 1)
	dir := poolDir(t, p)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := sessiondir.Spec{ID: "c", Argv: []string{"true"}, Env: testEnv}
	startCold(t, p, dir, spec, warm)
	if _, err := p.Start(ctxT(t, 10*time.Second), dir, spec); !errors.Is(err, sessiondir.ErrExists) {
		t.Errorf("second start: got %v, want ErrExists", err)
	}
	if got := p.WarmPIDs(); !slices.Equal(got, warm) {
		t.Errorf("idle warm shims: got %v, want %v", got, warm)
	}
}

// TestWarmShimBadSpec: a warm shim given a spec it cannot decode reports
// a setup error, removes its staging directory and exits, and no session
// directory is made.
func TestWarmShimBadSpec(t *testing.T) {
	p := newPool(t, 1)
	before := staged(t, p.Opts.Root)
	w := p.Take()
	dir := poolDir(t, p)
	if !w.Give(dir, []byte(`{"argv":`)) {
		t.Fatal("give: the warm shim could not be reached")
	}
	_, err := (&launch.Prepared{W: w}).Start(ctxT(t, 10*time.Second))
	var se *launch.StartError
	if !errors.As(err, &se) || se.ShimPID != w.Pid || se.Phase != proto.PhaseSetup {
		t.Fatalf("got %#v, want a setup StartError from shim %d", err, w.Pid)
	}
	waitGone(t, w.Pid)
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("session directory: %v, want none", err)
	}
	for _, d := range before {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("staging directory %s: %v, want it removed", d, err)
		}
	}
}

// TestStdinClosedSpec: a spec with StdinClosed runs its command with stdin
// at EOF (cold or through a warm shim), and a write is refused as after
// close-stdin; with a TTY it is invalid.
func TestStdinClosedSpec(t *testing.T) {
	p := newPool(t, 1)
	spec := sessiondir.Spec{StdinClosed: true, Argv: []string{"sh", "-c", "cat; echo done; sleep 0.3"}}
	for _, warm := range []bool{true, false} {
		var dir string
		if warm {
			dir, _ = poolStart(t, p, spec)
		} else {
			spec.ID, spec.Env = "cold", testEnv
			dir, _ = start(t, spec)
		}
		c := dial(t, dir)
		if err := c.WriteStdin(ctxT(t, 5*time.Second), []byte("x\n")); !errors.Is(err, sessiondir.ErrStdinClosed) {
			t.Errorf("warm %v: write: got %v, want ErrStdinClosed", warm, err)
		}
		if e := waitExit(t, dir); e.Code != 0 {
			t.Fatalf("warm %v: got %+v, want exit 0", warm, e)
		}
		if got := stdoutOf(t, dir); got != "done\n" {
			t.Errorf("warm %v: stdout %q, want %q", warm, got, "done\n")
		}
	}
	_, err := p.Start(ctxT(t, 5*time.Second), poolDir(t, p), sessiondir.Spec{ID: "t", TTY: true, StdinClosed: true, Argv: []string{"true"}, Env: testEnv})
	if !errors.Is(err, sessiondir.ErrInvalid) {
		t.Errorf("tty with stdin_closed: got %v, want ErrInvalid", err)
	}
}

// TestPreparedCancel: a prepared start that is cancelled never runs its
// command: the shim removes the session directory and exits, and Cancel
// returns once it has. One started after a while runs normally.
func TestPreparedCancel(t *testing.T) {
	p := newPool(t, 2)
	marker := filepath.Join(t.TempDir(), "ran")
	spec := sessiondir.Spec{ID: "c", Env: testEnv, Argv: []string{"sh", "-c", "echo > " + marker}}
	dir := poolDir(t, p)
	pr, err := p.Prepare(dir, spec)
	if err != nil || pr == nil {
		t.Fatalf("Prepare: %v, %v", pr, err)
	}
	pid := pr.W.Pid
	pr.Cancel()
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("session directory after Cancel: %v, want none", err)
	}
	waitGone(t, pid)
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the cancelled command ran: %v", err)
	}

	dir = poolDir(t, p)
	pr, err = p.Prepare(dir, spec)
	if err != nil || pr == nil {
		t.Fatalf("Prepare: %v, %v", pr, err)
	}
	time.Sleep(50 * time.Millisecond) // prepared, waiting for go
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the command ran before Start: %v", err)
	}
	st, err := pr.Start(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if e := waitExit(t, dir); e.Code != 0 {
		t.Fatalf("got %+v, want exit 0", e)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the started command did not run: %v", err)
	}
	waitGone(t, st.ShimPID)
}

// TestDetachWithoutSetsid: without a setsid(1) that forks, shims are
// detached by their own --detach intermediate, cold and warm alike: each
// in its own session, not a child of the starting process, and working.
func TestDetachWithoutSetsid(t *testing.T) {
	if launch.Detacher() == "" {
		t.Log("no setsid --fork on this machine: every test here uses the --detach intermediate")
	}
	orig := launch.Detacher
	launch.Detacher = func() string { return "" }
	t.Cleanup(func() { launch.Detacher = orig })

	p := newPool(t, 1)
	dir, st := poolStart(t, p, sessiondir.Spec{Argv: []string{"sh", "-c", "echo warm"}})
	cdir, cst := start(t, sessiondir.Spec{ID: "cold", Env: testEnv, Argv: []string{"sh", "-c", "echo cold"}})
	for _, c := range []struct {
		dir, want string
		st        sessiondir.Status
	}{{dir, "warm\n", st}, {cdir, "cold\n", cst}} {
		if sid, _ := unix.Getsid(c.st.ShimPID); sid != c.st.ShimPID {
			t.Errorf("shim %d: session %d, want its own", c.st.ShimPID, sid)
		}
		if ppid := parentOf(t, c.st.ShimPID); ppid == os.Getpid() {
			t.Errorf("shim %d is a child of the test process", c.st.ShimPID)
		}
		if e := waitExit(t, c.dir); e.Code != 0 {
			t.Fatalf("%s: got %+v, want exit 0", c.dir, e)
		}
		if got := stdoutOf(t, c.dir); got != c.want {
			t.Errorf("stdout %q, want %q", got, c.want)
		}
	}
}

// TestMissingShimProgram: a shim program that cannot be executed fails a
// start definitely (phase setup, nothing left behind), with setsid as the
// intermediate too, never as a start that may still come up.
func TestMissingShimProgram(t *testing.T) {
	dir := sessionDir(t)
	_, err := launch.Start(ctxT(t, 10*time.Second), []string{"/nonexistent/runner-shim", "serve"}, dir, sessiondir.Spec{ID: "x", Argv: []string{"true"}, Env: testEnv})
	var se *launch.StartError
	if !errors.As(err, &se) || se.Phase != proto.PhaseSetup {
		t.Fatalf("got %#v, want a StartError of phase setup", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("session directory left: %v", err)
	}
}
