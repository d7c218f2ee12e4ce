package launch_test

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
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// startCold starts spec in dir through p and checks that no warm shim of
// warm took it; it waits for the command's end and the shim's exit.
func startCold(t *testing.T, p *launch.Pool, dir string, spec sessiondir.Spec, warm []int) {
	t.Helper()
	st, err := p.Start(shimtest.CtxT(t, 10*time.Second), dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(warm, st.ShimPID) {
		t.Errorf("warm shim %d took a start that must be cold", st.ShimPID)
	}
	shimtest.WaitExit(t, dir)
	shimtest.WaitGone(t, st.ShimPID)
}

func TestPoolStart(t *testing.T) {
	p := shimtest.NewPool(t, 2)

	t.Run("exit code", func(t *testing.T) {
		dir, _ := shimtest.PoolStart(t, p, sessiondir.Spec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
		if e := shimtest.WaitExit(t, dir); e.Reason != journal.ReasonExited || e.Code != 3 || e.Lengths["stdout"] != 4 || e.Lengths["stderr"] != 4 {
			t.Fatalf("got %+v, want exited 3 with lengths 4/4", e)
		}
		if b, err := os.ReadFile(dir + "/" + sessiondir.LogFile); err != nil || len(b) != 0 {
			t.Errorf("shim.log: got %q %v, want an empty log", b, err)
		}
	})

	t.Run("runs before return", func(t *testing.T) {
		dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{Argv: []string{"cat"}})
		if sid, _ := unix.Getsid(st.ShimPID); sid != st.ShimPID {
			t.Errorf("shim %d: session %d, want its own", st.ShimPID, sid)
		}
		if ppid := shimtest.ParentOf(t, st.ShimPID); ppid == os.Getpid() {
			t.Errorf("shim %d is a child of the test process", st.ShimPID)
		}
		shimtest.CheckCat(t, dir, st)
	})

	t.Run("missing binary", func(t *testing.T) {
		warm := shimtest.WaitWarm(t, p, 1)
		dir := shimtest.PoolDir(t, p)
		_, err := p.Start(shimtest.CtxT(t, 10*time.Second), dir, sessiondir.Spec{ID: "x", Argv: []string{"/nonexistent/bin"}, Env: shimtest.TestEnv})
		var se *launch.StartError
		if !errors.As(err, &se) || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("got %v, want a StartError matching fs.ErrNotExist", err)
		}
		if !slices.Contains(warm, se.ShimPID) {
			t.Errorf("shim pid %d: want one of the warm shims %v", se.ShimPID, warm)
		}
		shimtest.WaitGone(t, se.ShimPID)
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("session dir left behind: %v", err)
		}
	})

	t.Run("tty", func(t *testing.T) {
		dir, _ := shimtest.PoolStart(t, p, sessiondir.Spec{TTY: true, Rows: 30, Cols: 100, Argv: []string{"sh", "-c", `tty >/dev/null && echo "is a tty"; stty size`}})
		if e := shimtest.WaitExit(t, dir); e.Code != 0 {
			t.Fatalf("got %+v, want exit 0", e)
		}
		out, _ := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
		if got := out[wire.StreamStdout].String(); got != "is a tty\r\n30 100\r\n" {
			t.Errorf("stdout: got %q", got)
		}
	})

	t.Run("netns", func(t *testing.T) {
		shimtest.NeedRoot(t)
		nsPath, ino := shimtest.NewNetNS(t)
		conf, content := shimtest.ResolvFixture(t)
		dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{Argv: []string{"sh", "-c", "cat /etc/resolv.conf; readlink /proc/self/ns/net"}, NetNS: nsPath, ResolvConf: conf})
		if e := shimtest.WaitExit(t, dir); e.Code != 0 {
			t.Fatalf("got %+v, want exit 0", e)
		}
		if got, want := shimtest.StdoutOf(t, dir), fmt.Sprintf("%snet:[%d]\n", content, ino); got != want {
			t.Errorf("pid %d: got %q, want %q", st.PID, got, want)
		}
	})
}

func TestPoolCloseStopsWarmShims(t *testing.T) {
	root := shimtest.PoolRoot(t)
	p := launch.NewPool(shimtest.ShimExe, launch.PoolOptions{Size: 3, Root: root})
	pids := shimtest.WaitWarm(t, p, 3)
	if got := shimtest.Staged(t, root); len(got) != 3 {
		t.Fatalf("staging directories: got %q, want one per warm shim", got)
	}
	p.Close()
	// Close returns once every idle warm shim has removed its staging
	// directory (a stopping runnerd leaves none behind).
	if got := shimtest.Staged(t, root); len(got) != 0 {
		t.Errorf("staging directories left after Close: %q", got)
	}
	p.Close() // idempotent
	for _, pid := range pids {
		shimtest.WaitGone(t, pid)
	}
	// A closed pool still starts, cold.
	startCold(t, p, shimtest.SessionDir(t), sessiondir.Spec{ID: "c", Argv: []string{"true"}, Env: shimtest.TestEnv}, pids)
}

func TestPoolRefills(t *testing.T) {
	p := shimtest.NewPool(t, 1)
	first := shimtest.WaitWarm(t, p, 1)
	shimtest.PoolStart(t, p, sessiondir.Spec{Argv: []string{"true"}})
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
	p := shimtest.NewPool(t, 2)
	pids := p.WarmPIDs()
	deadStage := launch.FirstIdleStage(p)
	syscall.Kill(pids[0], syscall.SIGKILL)
	shimtest.WaitGone(t, pids[0])
	dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{Argv: []string{"true"}})
	if st.ShimPID != pids[1] {
		t.Errorf("shim pid %d: want the live warm shim %d", st.ShimPID, pids[1])
	}
	if _, err := os.Stat(deadStage); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dead warm shim's staging directory %s: %v, want it removed", deadStage, err)
	}
	shimtest.WaitExit(t, dir)
}

// poolHelperEnv makes the test binary a pool owner that is killed by the
// test: "idle" keeps a full pool, "take DIR" starts a session through it.
// It prints "warm PIDS" and, for take, "ok SHIMPID", then sleeps.
const poolHelperEnv = "RUNNER_SHIM_TEST_POOL"

// poolHelperRootEnv names the helper's pool root.
const poolHelperRootEnv = "RUNNER_SHIM_TEST_POOL_ROOT"

func poolHelper() int {
	exe, _ := os.Executable()
	os.Setenv(shimtest.AsShimEnv, "1")
	p := launch.NewPool([]string{exe}, launch.PoolOptions{Size: 2, Root: os.Getenv(poolHelperRootEnv)})
	deadline := time.Now().Add(15 * time.Second)
	for len(p.WarmPIDs()) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("warm", strings.Trim(fmt.Sprint(p.WarmPIDs()), "[]"))
	if dir, ok := strings.CutPrefix(os.Getenv(poolHelperEnv), "take "); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := p.Start(ctx, dir, sessiondir.Spec{ID: "survivor", Env: shimtest.TestEnv,
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
	helper.Env = append(os.Environ(), poolHelperEnv+"="+mode, poolHelperRootEnv+"="+root, shimtest.AsShimEnv+"=0")
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
	root := shimtest.PoolRoot(t)
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
		shimtest.WaitGone(t, pid)
	}
	if got := shimtest.Staged(t, root); len(got) != 0 {
		t.Errorf("staging directories left after the warm shims exited: %q", got)
	}
}

func TestTakenShimSurvivesOwnerKill(t *testing.T) {
	dir := shimtest.SessionDir(t)
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
	t.Cleanup(func() { shimtest.WaitGone(t, shimPID) })
	for _, pid := range warm {
		if pid != shimPID {
			shimtest.WaitGone(t, pid) // the other, still warm, exits
		}
	}
	st, err := sessiondir.ReadStatus(dir)
	if err != nil || st.State != sessiondir.StateRunning || st.ShimPID != shimPID {
		t.Fatalf("after the owner died: got %+v %v, want running under shim %d", st, err, shimPID)
	}
	c := shimtest.Dial(t, dir)
	if err := c.WriteStdin(shimtest.CtxT(t, 10*time.Second), []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	out, term := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
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
	root := shimtest.PoolRoot(t)
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
			cmd := exec.Command(shimtest.ShimExe[0], append(slices.Clone(shimtest.ShimExe[1:]), "--warm-fd=3", "--warm-root="+root)...)
			cmd.ExtraFiles = []*os.File{theirs}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			theirs.Close()
			line, err := bufio.NewReader(ours).ReadString('\n')
			got := shimtest.Staged(t, root)
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
	p := shimtest.NewPool(t, 1)
	for _, tty := range []bool{false, true} {
		dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{ID: "st", TTY: tty, Argv: []string{"echo", "hi"}})
		if e := shimtest.WaitExit(t, dir); e.Reason != journal.ReasonExited || e.Code != 0 {
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
		if got := shimtest.StdoutOf(t, dir); got != want {
			t.Errorf("tty %v: stdout %q, want %q", tty, got, want)
		}
	}
	shimtest.WaitWarm(t, p, 1)
	if got := shimtest.Staged(t, p.Root()); len(got) != 1 {
		t.Errorf("staging directories: got %q, want only the refill's", got)
	}
}

// TestPoolExistingDirStartsCold: a warm shim makes its session directory
// by rename, so a directory that exists is started cold, by Start's rules
// (a second start of it is ErrExists), and the warm shim stays idle.
func TestPoolExistingDirStartsCold(t *testing.T) {
	p := shimtest.NewPool(t, 1)
	warm := shimtest.WaitWarm(t, p, 1)
	dir := shimtest.PoolDir(t, p)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := sessiondir.Spec{ID: "c", Argv: []string{"true"}, Env: shimtest.TestEnv}
	startCold(t, p, dir, spec, warm)
	if _, err := p.Start(shimtest.CtxT(t, 10*time.Second), dir, spec); !errors.Is(err, sessiondir.ErrExists) {
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
	p := shimtest.NewPool(t, 1)
	before := shimtest.Staged(t, p.Root())
	w := launch.Take(p)
	dir := shimtest.PoolDir(t, p)
	if !launch.Give(w, dir, []byte(`{"argv":`)) {
		t.Fatal("give: the warm shim could not be reached")
	}
	_, err := launch.PreparedWith(w).Start(shimtest.CtxT(t, 10*time.Second))
	var se *launch.StartError
	if !errors.As(err, &se) || se.ShimPID != launch.PID(w) || se.Phase != launch.PhaseSetup {
		t.Fatalf("got %#v, want a setup StartError from shim %d", err, launch.PID(w))
	}
	shimtest.WaitGone(t, launch.PID(w))
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
	p := shimtest.NewPool(t, 1)
	spec := sessiondir.Spec{StdinClosed: true, Argv: []string{"sh", "-c", "cat; echo done; sleep 0.3"}}
	for _, warm := range []bool{true, false} {
		var dir string
		if warm {
			dir, _ = shimtest.PoolStart(t, p, spec)
		} else {
			spec.ID, spec.Env = "cold", shimtest.TestEnv
			dir, _ = shimtest.Start(t, spec)
		}
		c := shimtest.Dial(t, dir)
		if err := c.WriteStdin(shimtest.CtxT(t, 5*time.Second), []byte("x\n")); !errors.Is(err, sessiondir.ErrStdinClosed) {
			t.Errorf("warm %v: write: got %v, want ErrStdinClosed", warm, err)
		}
		if e := shimtest.WaitExit(t, dir); e.Code != 0 {
			t.Fatalf("warm %v: got %+v, want exit 0", warm, e)
		}
		if got := shimtest.StdoutOf(t, dir); got != "done\n" {
			t.Errorf("warm %v: stdout %q, want %q", warm, got, "done\n")
		}
	}
	_, err := p.Start(shimtest.CtxT(t, 5*time.Second), shimtest.PoolDir(t, p), sessiondir.Spec{ID: "t", TTY: true, StdinClosed: true, Argv: []string{"true"}, Env: shimtest.TestEnv})
	if !errors.Is(err, sessiondir.ErrInvalid) {
		t.Errorf("tty with stdin_closed: got %v, want ErrInvalid", err)
	}
}

// TestPreparedCancel: a prepared start that is cancelled never runs its
// command: the shim removes the session directory and exits, and Cancel
// returns once it has. One started after a while runs normally.
func TestPreparedCancel(t *testing.T) {
	p := shimtest.NewPool(t, 2)
	marker := filepath.Join(t.TempDir(), "ran")
	spec := sessiondir.Spec{ID: "c", Env: shimtest.TestEnv, Argv: []string{"sh", "-c", "echo > " + marker}}
	dir := shimtest.PoolDir(t, p)
	pr, err := p.Prepare(dir, spec)
	if err != nil || pr == nil {
		t.Fatalf("Prepare: %v, %v", pr, err)
	}
	pid := launch.PreparedPID(pr)
	pr.Cancel()
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("session directory after Cancel: %v, want none", err)
	}
	shimtest.WaitGone(t, pid)
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the cancelled command ran: %v", err)
	}

	dir = shimtest.PoolDir(t, p)
	pr, err = p.Prepare(dir, spec)
	if err != nil || pr == nil {
		t.Fatalf("Prepare: %v, %v", pr, err)
	}
	time.Sleep(50 * time.Millisecond) // prepared, waiting for go
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the command ran before Start: %v", err)
	}
	st, err := pr.Start(shimtest.CtxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if e := shimtest.WaitExit(t, dir); e.Code != 0 {
		t.Fatalf("got %+v, want exit 0", e)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the started command did not run: %v", err)
	}
	shimtest.WaitGone(t, st.ShimPID)
}

// TestDetachWithoutSetsid: without a setsid(1) that forks, shims are
// detached by their own --detach intermediate, cold and warm alike: each
// in its own session, not a child of the starting process, and working.
func TestDetachWithoutSetsid(t *testing.T) {
	if (*launch.Detacher)() == "" {
		t.Log("no setsid --fork on this machine: every test here uses the --detach intermediate")
	}
	orig := *launch.Detacher
	*launch.Detacher = func() string { return "" }
	t.Cleanup(func() { *launch.Detacher = orig })

	p := shimtest.NewPool(t, 1)
	dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{Argv: []string{"sh", "-c", "echo warm"}})
	cdir, cst := shimtest.Start(t, sessiondir.Spec{ID: "cold", Env: shimtest.TestEnv, Argv: []string{"sh", "-c", "echo cold"}})
	for _, c := range []struct {
		dir, want string
		st        sessiondir.Status
	}{{dir, "warm\n", st}, {cdir, "cold\n", cst}} {
		if sid, _ := unix.Getsid(c.st.ShimPID); sid != c.st.ShimPID {
			t.Errorf("shim %d: session %d, want its own", c.st.ShimPID, sid)
		}
		if ppid := shimtest.ParentOf(t, c.st.ShimPID); ppid == os.Getpid() {
			t.Errorf("shim %d is a child of the test process", c.st.ShimPID)
		}
		if e := shimtest.WaitExit(t, c.dir); e.Code != 0 {
			t.Fatalf("%s: got %+v, want exit 0", c.dir, e)
		}
		if got := shimtest.StdoutOf(t, c.dir); got != c.want {
			t.Errorf("stdout %q, want %q", got, c.want)
		}
	}
}

// TestMissingShimProgram: a shim program that cannot be executed fails a
// start definitely (phase setup, nothing left behind), with setsid as the
// intermediate too, never as a start that may still come up.
func TestMissingShimProgram(t *testing.T) {
	dir := shimtest.SessionDir(t)
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), []string{"/nonexistent/runner-shim", "serve"}, dir, sessiondir.Spec{ID: "x", Argv: []string{"true"}, Env: shimtest.TestEnv})
	var se *launch.StartError
	if !errors.As(err, &se) || se.Phase != launch.PhaseSetup {
		t.Fatalf("got %#v, want a StartError of phase setup", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("session directory left: %v", err)
	}
}
