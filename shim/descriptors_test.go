package shim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// leakDescriptors makes two free descriptors from 200 up of the test
// process a pipe's write end without close-on-exec, as a shell that
// starts runnerd can leave them (fd 10 and 251 in the report): every shim
// this test starts inherits both (Start's os/exec does not close them),
// and so would its command without the exec path's close-on-exec step.
// It returns the numbers; cleanup closes them.
func leakDescriptors(t *testing.T) []int {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	var fds []int
	for fd := 200; len(fds) < 2; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			continue // in use (this process may have inherited some itself)
		}
		if err := unix.Dup3(p[1], fd, 0); err != nil { // no O_CLOEXEC: inherited
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		fds = append(fds, fd)
	}
	return fds
}

// openFDs parses `ls -l /proc/self/fd` (one line per descriptor, "N ->
// target") into descriptor numbers, leaving out the directory ls itself
// opened to list them.
func openFDs(t *testing.T, out string) []string {
	t.Helper()
	var fds []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[len(f)-2] != "->" {
			continue // "total 0"
		}
		fd, target := f[len(f)-3], f[len(f)-1]
		if strings.HasPrefix(target, "/proc/") && strings.HasSuffix(target, "/fd") {
			continue // ls's own directory descriptor
		}
		fds = append(fds, fd)
	}
	return fds
}

// TestCommandInheritsOnlyStdio: with two descriptors open (not
// close-on-exec) in the process that starts the shim, a command sees only
// 0, 1 and 2, on each exec path: direct, the helper forked for the start
// (Isolate), and a warm shim's helper started ahead.
func TestCommandInheritsOnlyStdio(t *testing.T) {
	leakDescriptors(t)
	argv := []string{"ls", "-l", "/proc/self/fd"}
	check := func(t *testing.T, dir string) {
		t.Helper()
		if e := shimtest.WaitExit(t, dir); e.Code != 0 {
			t.Fatalf("exit %+v", e)
		}
		out := shimtest.StdoutOf(t, dir)
		if got := fmt.Sprint(openFDs(t, out)); got != "[0 1 2]" {
			t.Fatalf("command's descriptors: got %s, want [0 1 2]\n%s", got, out)
		}
	}
	t.Run("direct", func(t *testing.T) {
		dir, _ := shimtest.Start(t, sessiondir.Spec{ID: "d", Argv: argv, Env: shimtest.TestEnv})
		check(t, dir)
	})
	t.Run("tty", func(t *testing.T) {
		dir, _ := shimtest.Start(t, sessiondir.Spec{ID: "t", Argv: argv, Env: shimtest.TestEnv, TTY: true, Rows: 24, Cols: 200})
		check(t, dir)
	})
	t.Run("helper", func(t *testing.T) {
		shimtest.NeedRoot(t)
		dir, _ := shimtest.Start(t, sessiondir.Spec{ID: "h", Argv: argv, Env: shimtest.TestEnv, User: "nobody", Isolate: true})
		check(t, dir)
	})
	t.Run("helper ahead", func(t *testing.T) {
		shimtest.NeedRoot(t)
		p := launch.NewPool(shimtest.ShimExe, launch.PoolOptions{Size: 1, Root: shimtest.PoolRoot(t), Helper: launch.HelperAlways})
		t.Cleanup(func() { p.Close() })
		shimtest.WaitWarm(t, p, 1)
		dir := shimtest.PoolDir(t, p)
		ctx := shimtest.CtxT(t, 10*time.Second)
		st, err := p.Start(ctx, dir, sessiondir.Spec{ID: "a", Argv: argv, Env: shimtest.TestEnv, User: "nobody", Isolate: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shimtest.WaitGone(t, st.ShimPID) })
		check(t, dir)
	})
}

// TestMarkCloseOnExec: a descriptor opened without O_CLOEXEC carries the
// flag afterwards, and stays open.
func TestMarkCloseOnExec(t *testing.T) {
	fds := leakDescriptors(t)
	if err := MarkCloseOnExec(); err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || fl&unix.FD_CLOEXEC == 0 {
			t.Errorf("fd %d: flags %d (%v), want FD_CLOEXEC", fd, fl, err)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil {
			t.Errorf("fd %d after marking: %v, want it still open", fd, err)
		}
	}
}
