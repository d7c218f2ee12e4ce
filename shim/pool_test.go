package shim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/wire"
)

// newPool starts a pool of size and waits until it is full; Close is
// registered as cleanup.
func newPool(t *testing.T, size int) *Pool {
	t.Helper()
	p := NewPool(shimExe, size)
	t.Cleanup(func() { p.Close() })
	waitWarm(t, p, size)
	return p
}

func waitWarm(t *testing.T, p *Pool, n int) []int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if pids := p.pids(); len(pids) >= n {
			return pids
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pool: got %d warm shims, want %d", len(p.pids()), n)
	return nil
}

// poolStart starts spec through p, checks that a warm shim took it, and
// registers the same cleanup as start.
func poolStart(t *testing.T, p *Pool, spec Spec) (string, Status) {
	t.Helper()
	warm := waitWarm(t, p, 1)
	dir := sessionDir(t)
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
		if c, err := Dial(ctxT(t, 5*time.Second), dir); err == nil {
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
		dir, _ := poolStart(t, p, Spec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
		if e := waitExit(t, dir); e.Reason != journal.ReasonExited || e.Code != 3 || e.Lengths["stdout"] != 4 || e.Lengths["stderr"] != 4 {
			t.Fatalf("got %+v, want exited 3 with lengths 4/4", e)
		}
		if b, err := os.ReadFile(dir + "/" + LogFile); err != nil || len(b) != 0 {
			t.Errorf("shim.log: got %q %v, want an empty log", b, err)
		}
	})

	t.Run("runs before return", func(t *testing.T) {
		dir, st := poolStart(t, p, Spec{Argv: []string{"cat"}})
		if err := syscall.Kill(st.PID, 0); err != nil {
			t.Fatalf("command pid %d: %v", st.PID, err)
		}
		if sid, _ := unix.Getsid(st.ShimPID); sid != st.ShimPID {
			t.Errorf("shim %d: session %d, want its own", st.ShimPID, sid)
		}
		if ppid := parentOf(t, st.ShimPID); ppid == os.Getpid() {
			t.Errorf("shim %d is a child of the test process", st.ShimPID)
		}
		c := dial(t, dir)
		ctx := ctxT(t, 10*time.Second)
		if err := c.WriteStdin(ctx, []byte("hi\n")); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseStdin(ctx); err != nil {
			t.Fatal(err)
		}
		if e := waitExit(t, dir); e.Code != 0 || e.Lengths["stdout"] != 3 {
			t.Fatalf("got %+v, want exit 0 with 3 bytes", e)
		}
	})

	t.Run("missing binary", func(t *testing.T) {
		warm := waitWarm(t, p, 1)
		dir := sessionDir(t)
		_, err := p.Start(ctxT(t, 10*time.Second), dir, Spec{ID: "x", Argv: []string{"/nonexistent/bin"}, Env: testEnv})
		var se *StartError
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
		dir, _ := poolStart(t, p, Spec{TTY: true, Rows: 30, Cols: 100, Argv: []string{"sh", "-c", `tty >/dev/null && echo "is a tty"; stty size`}})
		if e := waitExit(t, dir); e.Code != 0 {
			t.Fatalf("got %+v, want exit 0", e)
		}
		out, _ := attachAll(t, dir, AttachOptions{})
		if got := out[wire.StreamStdout].String(); got != "is a tty\r\n30 100\r\n" {
			t.Errorf("stdout: got %q", got)
		}
	})

	t.Run("netns", func(t *testing.T) {
		needRoot(t)
		nsPath, ino := newNetNS(t)
		conf, content := resolvFixture(t)
		dir, st := poolStart(t, p, Spec{Argv: []string{"sh", "-c", "cat /etc/resolv.conf; readlink /proc/self/ns/net"}, NetNS: nsPath, ResolvConf: conf})
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
	p := NewPool(shimExe, 3)
	pids := waitWarm(t, p, 3)
	p.Close()
	p.Close() // idempotent
	for _, pid := range pids {
		waitGone(t, pid)
	}
	// A closed pool still starts, cold.
	dir := sessionDir(t)
	st, err := p.Start(ctxT(t, 10*time.Second), dir, Spec{ID: "c", Argv: []string{"true"}, Env: testEnv})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pids, st.ShimPID) {
		t.Errorf("a closed pool used warm shim %d", st.ShimPID)
	}
	waitExit(t, dir)
	waitGone(t, st.ShimPID)
}

func TestPoolRefills(t *testing.T) {
	p := newPool(t, 1)
	first := waitWarm(t, p, 1)
	poolStart(t, p, Spec{Argv: []string{"true"}})
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if pids := p.pids(); len(pids) == 1 && pids[0] != first[0] {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("pool not refilled: %v", p.pids())
}

// A warm shim killed while idle is skipped, not handed the session.
func TestPoolSkipsDeadWarmShim(t *testing.T) {
	p := newPool(t, 2)
	pids := p.pids()
	syscall.Kill(pids[0], syscall.SIGKILL)
	waitGone(t, pids[0])
	dir, st := poolStart(t, p, Spec{Argv: []string{"true"}})
	if st.ShimPID != pids[1] {
		t.Errorf("shim pid %d: want the live warm shim %d", st.ShimPID, pids[1])
	}
	waitExit(t, dir)
}

// poolHelperEnv makes the test binary a pool owner that is killed by the
// test: "idle" keeps a full pool, "take DIR" starts a session through it.
// It prints "warm PIDS" and, for take, "ok SHIMPID", then sleeps.
const poolHelperEnv = "RUNNER_SHIM_TEST_POOL"

func poolHelper() int {
	exe, _ := os.Executable()
	os.Setenv(asShimEnv, "1")
	p := NewPool([]string{exe}, 2)
	deadline := time.Now().Add(15 * time.Second)
	for len(p.pids()) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("warm", strings.Trim(fmt.Sprint(p.pids()), "[]"))
	if dir, ok := strings.CutPrefix(os.Getenv(poolHelperEnv), "take "); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := p.Start(ctx, dir, Spec{ID: "survivor", Env: testEnv,
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
func runPoolHelper(t *testing.T, mode string, want int) (*exec.Cmd, [][]string) {
	t.Helper()
	exe, _ := os.Executable()
	helper := exec.Command(exe)
	helper.Env = append(os.Environ(), poolHelperEnv+"="+mode, asShimEnv+"=0")
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
	helper, lines := runPoolHelper(t, "idle", 1)
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
}

func TestTakenShimSurvivesOwnerKill(t *testing.T) {
	dir := sessionDir(t)
	helper, lines := runPoolHelper(t, "take "+dir, 2)
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
	st, err := ReadStatus(dir)
	if err != nil || st.State != StateRunning || st.ShimPID != shimPID {
		t.Fatalf("after the owner died: got %+v %v, want running under shim %d", st, err, shimPID)
	}
	c := dial(t, dir)
	if err := c.WriteStdin(ctxT(t, 10*time.Second), []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	out, term := attachAll(t, dir, AttachOptions{})
	if got := out[wire.StreamStdout].String(); got != "started\ngot hello\n" {
		t.Fatalf("stdout: got %q", got)
	}
	if e, err := term.Exit(); err != nil || term.Kind != wire.FrameExit || e.Code != 42 {
		t.Fatalf("terminal: got %s %+v %v, want exit 42", term.Kind, e, err)
	}
}

// TestWarmShimIgnoresPartialLine: a warm shim whose socket reaches EOF
// before a complete line (the pool died mid-write) exits 0 having touched
// nothing, whatever bytes it got.
func TestWarmShimIgnoresPartialLine(t *testing.T) {
	tests := []struct {
		name string
		sent string
	}{
		{"nothing", ""},
		{"a directory without its newline", t.TempDir()},
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
			cmd := exec.Command(shimExe[0], append(slices.Clone(shimExe[1:]), "--warm-fd=3")...)
			cmd.ExtraFiles = []*os.File{theirs}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			theirs.Close()
			line, err := bufio.NewReader(ours).ReadString('\n')
			if want := fmt.Sprintf("warm %d\n", cmd.Process.Pid); err != nil || line != want {
				t.Fatalf("got %q, %v, want %q", line, err, want)
			}
			ours.WriteString(tt.sent)
			unix.Shutdown(fds[0], unix.SHUT_WR)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("warm shim: got %v, want exit 0", err)
			}
			if tt.sent != "" && !strings.HasSuffix(tt.sent, "\n") {
				if ents, _ := os.ReadDir(tt.sent); len(ents) != 0 {
					t.Fatalf("it touched %s: %d entries, want none", tt.sent, len(ents))
				}
			}
		})
	}
}
