package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// Tests of the nsexec helper started ahead by a warm shim (nsexec.go,
// exec.go): it runs the command with every step a helper forked for the
// start would have done, it never outlives a warm shim that did not use
// it, and a dead one costs a start nothing but the fork of a new helper.

// newHelperPool is newPool whose warm shims start the helper ahead.
func newHelperPool(t *testing.T, size int) *launch.Pool {
	t.Helper()
	p := launch.NewPool(shimtest.ShimExe, launch.PoolOptions{Size: size, Root: shimtest.PoolRoot(t), Helper: launch.HelperAlways})
	t.Cleanup(func() { p.Close() })
	shimtest.WaitWarm(t, p, size)
	return p
}

// aheadHelperOf returns the pid of the helper warm shim shimPID started
// ahead: its child with the helper's argument.
func aheadHelperOf(t *testing.T, shimPID int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(b), "\x00"+nsexecAheadArg) {
			continue
		}
		if ppid, err := ppidOf(pid); err == nil && ppid == shimPID {
			return pid
		}
	}
	t.Fatalf("warm shim %d has no helper started ahead", shimPID)
	return 0
}

// ppidOf reads pid's parent from /proc/PID/stat (after the command name,
// which may hold spaces, in parentheses).
func ppidOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return strconv.Atoi(f[1])
}

// TestAheadHelperRunsCommand: the command of a warm shim with a helper
// ahead is that helper (same pid), placed in every cgroup (v1 by the
// helper, v2 by the helper writing cgroup.procs), isolated, in its
// network namespace (the helper's setns before execve), with the shim in
// none of the cgroups; and a TTY session gets the terminal as its
// controlling terminal.
func TestAheadHelperRunsCommand(t *testing.T) {
	shimtest.NeedRoot(t)
	cgs := makeCgroups(t, true, true)
	ns, ino := shimtest.NewNetNS(t)
	p := newHelperPool(t, 1)

	t.Run("cgroups, isolate, netns", func(t *testing.T) {
		warm := shimtest.WaitWarm(t, p, 1)
		helper := aheadHelperOf(t, warm[0])
		dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{User: "nobody", Isolate: true, Cgroups: dirsOf(cgs), NetNS: ns,
			Argv: []string{"sh", "-c", "grep -E '^(NoNewPrivs|CapBnd|Uid|Seccomp):' /proc/self/status; cat /proc/self/cgroup; stat -L -c 'netns %i' /proc/self/ns/net"}})
		if st.PID != helper {
			t.Fatalf("command pid %d, want the helper started ahead %d", st.PID, helper)
		}
		if e := shimtest.WaitExit(t, dir); e.Code != 0 {
			t.Fatalf("exit %+v, output %q", e, shimtest.StdoutOf(t, dir))
		}
		out := shimtest.StdoutOf(t, dir)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		want := []string{"NoNewPrivs:\t1", "CapBnd:\t" + keptBoundingHex, "Seccomp:\t2", "Uid:\t65534\t65534\t65534\t65534", fmt.Sprintf("netns %d", ino)}
		for _, c := range cgs {
			want = append(want, c.Line)
		}
		for _, w := range want {
			if !slices.Contains(lines, w) {
				t.Errorf("output lacks %q:\n%s", w, out)
			}
		}
		shimCg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", st.ShimPID))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cgs {
			if strings.Contains(string(shimCg), c.Line+"\n") {
				t.Errorf("the shim %d is in the command's cgroup %s", st.ShimPID, c.Dir)
			}
		}
	})

	t.Run("tty", func(t *testing.T) {
		warm := shimtest.WaitWarm(t, p, 1)
		helper := aheadHelperOf(t, warm[0])
		// Field 7 of /proc/self/stat is tty_nr: 0 without a controlling
		// terminal. The shell's read splits it out (comm is "sh").
		dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{TTY: true, Cgroups: dirsOf(cgs),
			Argv: []string{"sh", "-c", `read pid comm state ppid pgrp sid tty rest < /proc/self/stat; test -t 0 && test "$tty" != 0 && echo ctty-ok`}})
		if st.PID != helper {
			t.Fatalf("command pid %d, want the helper started ahead %d", st.PID, helper)
		}
		if e := shimtest.WaitExit(t, dir); e.Code != 0 || !strings.Contains(shimtest.StdoutOf(t, dir), "ctty-ok") {
			t.Fatalf("exit %+v, output %q, want 0 and ctty-ok", e, shimtest.StdoutOf(t, dir))
		}
	})
}

// TestAheadHelperKilledWhileWaiting: a helper killed while its warm shim
// waits neither fails nor hangs the start: the shim forks a helper for it
// instead, and reaps the dead one. (Without the fallback in
// execCommand the start fails: "the helper ended before executing
// the command".)
func TestAheadHelperKilledWhileWaiting(t *testing.T) {
	shimtest.NeedRoot(t)
	cgs := makeCgroups(t, true, false)
	p := newHelperPool(t, 1)
	warm := shimtest.WaitWarm(t, p, 1)
	helper := aheadHelperOf(t, warm[0])
	if err := syscall.Kill(helper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for processState(helper) != "Z" { // dead, not reaped: the warm shim waits on its socket
		if time.Now().After(deadline) {
			t.Fatalf("helper %d: state %q, want a zombie", helper, processState(helper))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t0 := time.Now()
	dir, st := shimtest.PoolStart(t, p, sessiondir.Spec{Cgroups: dirsOf(cgs), Argv: []string{"cat", "/proc/self/cgroup"}})
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("start took %v", d)
	}
	if st.PID == helper {
		t.Fatalf("command pid %d is the dead helper's", st.PID)
	}
	if e := shimtest.WaitExit(t, dir); e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	out := shimtest.StdoutOf(t, dir)
	for _, c := range cgs {
		if !strings.Contains(out, c.Line+"\n") {
			t.Errorf("output lacks %q:\n%s", c.Line, out)
		}
	}
	waitReaped(t, helper, 5*time.Second)
}

// TestAheadHelperNeverLeft: a helper started ahead ends with its warm
// shim however that ends: unused by a command on the direct path (killed
// and reaped at the start), retired by Pool.Close, or with the warm shim
// killed (it reads EOF and exits).
func TestAheadHelperNeverLeft(t *testing.T) {
	shimtest.NeedRoot(t)
	t.Run("direct path", func(t *testing.T) {
		p := newHelperPool(t, 1)
		warm := shimtest.WaitWarm(t, p, 1)
		helper := aheadHelperOf(t, warm[0])
		_, st := shimtest.PoolStart(t, p, sessiondir.Spec{Argv: []string{"sleep", "30"}})
		if st.PID == helper {
			t.Fatalf("a plain command took the helper %d", helper)
		}
		waitReaped(t, helper, 5*time.Second)
	})
	t.Run("pool closed", func(t *testing.T) {
		p := newHelperPool(t, 1)
		warm := shimtest.WaitWarm(t, p, 1)
		helper := aheadHelperOf(t, warm[0])
		p.Close()
		waitReaped(t, helper, 5*time.Second)
		shimtest.WaitGone(t, warm[0])
	})
	t.Run("warm shim killed", func(t *testing.T) {
		p := newHelperPool(t, 1)
		warm := shimtest.WaitWarm(t, p, 1)
		helper := aheadHelperOf(t, warm[0])
		if err := syscall.Kill(warm[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		shimtest.WaitGone(t, warm[0])
		// Reparented to init (or this test's subreaper, if any), which
		// reaps it once it has exited on EOF.
		deadline := time.Now().Add(5 * time.Second)
		for !gone(helper) && processState(helper) != "Z" {
			if time.Now().After(deadline) {
				t.Fatalf("helper %d still %q after its warm shim died", helper, processState(helper))
			}
			time.Sleep(5 * time.Millisecond)
		}
		for _, d := range shimtest.Staged(t, p.Root()) {
			os.RemoveAll(d) // what the killed warm shim staged
		}
	})
}

// TestPoolHelperAuto: in HelperAuto, warm shims start without a helper
// until a start needs one, and with one from then on.
func TestPoolHelperAuto(t *testing.T) {
	shimtest.NeedRoot(t)
	cgs := makeCgroups(t, true, false)
	p := shimtest.NewPool(t, 1)
	warm := shimtest.WaitWarm(t, p, 1)
	if p.HelperAhead() {
		t.Fatal("auto pool starts helpers before any start needed one")
	}
	dir, _ := shimtest.PoolStart(t, p, sessiondir.Spec{Cgroups: dirsOf(cgs), Argv: []string{"true"}})
	shimtest.WaitExit(t, dir)
	if !p.HelperAhead() {
		t.Fatal("auto pool: a start needed the helper, still none ahead")
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		w := p.WarmPIDs()
		if len(w) == 1 && w[0] != warm[0] {
			aheadHelperOf(t, w[0])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new warm shim: %v", w)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAheadHelperWaitsForGo: a prepared start hands the plan to the
// helper started ahead, which joins the command's cgroups while the
// pool's owner commits, but runs the command only on Start: a Cancel
// after the helper has done its steps runs nothing and leaves no helper.
func TestAheadHelperWaitsForGo(t *testing.T) {
	shimtest.NeedRoot(t)
	cgs := makeCgroups(t, true, false)
	p := newHelperPool(t, 1)
	marker := filepath.Join(t.TempDir(), "ran")
	spec := sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Cgroups: dirsOf(cgs), Argv: []string{"touch", marker}}
	inCgroup := func(pid int) bool {
		b, _ := os.ReadFile(filepath.Join(cgs[0].Dir, "cgroup.procs"))
		return slices.Contains(strings.Fields(string(b)), strconv.Itoa(pid))
	}
	prepare := func() (*launch.Prepared, int, string) {
		warm := shimtest.WaitWarm(t, p, 1)
		helper := aheadHelperOf(t, warm[0])
		dir := shimtest.PoolDir(t, p)
		pr, err := p.Prepare(dir, spec)
		if err != nil || pr == nil {
			t.Fatalf("prepare: %v %v", pr, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !inCgroup(helper) {
			if time.Now().After(deadline) {
				t.Fatalf("helper %d not in %s before the start", helper, cgs[0].Dir)
			}
			time.Sleep(2 * time.Millisecond)
		}
		return pr, helper, dir
	}

	pr, helper, _ := prepare()
	time.Sleep(50 * time.Millisecond) // time enough to run, were it not waiting
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran before Start")
	}
	pr.Cancel()
	waitReaped(t, helper, 5*time.Second)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran after Cancel")
	}

	pr, helper, dir := prepare()
	st, err := pr.Start(shimtest.CtxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shimtest.WaitGone(t, st.ShimPID) })
	if st.PID != helper {
		t.Fatalf("command pid %d, want the helper %d", st.PID, helper)
	}
	if e := shimtest.WaitExit(t, dir); e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the command did not run: %v", err)
	}
}
