package shim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// TestExecStepOrder pins the exec path's order (exec.go) and its
// invariant: the steps only the fork can do come before every step the
// helper does, since the helper's own fork does them.
func TestExecStepOrder(t *testing.T) {
	var names []string
	helperSeen := false
	for _, st := range execSteps {
		names = append(names, st.name)
		if st.helper != nil {
			helperSeen = true
		} else if helperSeen {
			t.Errorf("step %q is fork-only but comes after a helper step", st.name)
		}
		if st.fork == nil && st.helper == nil {
			t.Errorf("step %q can be done nowhere", st.name)
		}
	}
	want := []string{
		"join cgroup v2", "enter network namespace", "join cgroups v1", "mount resolv.conf", "bind directories", "set hostname",
		"empty the capability bounding set", "open the working directory", "switch user", "clear ambient and inheritable capabilities",
		"set no_new_privs", "chdir", "mark inherited descriptors close-on-exec", "load the seccomp filter",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("steps: got %q, want %q", names, want)
	}
}

// TestExecPathChoice: an ordinary spec takes the direct path (no helper,
// nothing added to today's start); each helper-only step forces the
// helper.
func TestExecPathChoice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		plan   execPlan
		helper bool
	}{
		{"plain", execPlan{}, false},
		{"user, dir, netns", execPlan{Cred: &nsexecCred{UID: 1}, Dir: "/", NetNS: "/x"}, false},
		{"cgroup v2 only", execPlan{CgroupV2: "/sys/fs/cgroup/x"}, false},
		{"cgroup v1", execPlan{CgroupsV1: []string{"/sys/fs/cgroup/pids/x"}}, true},
		{"resolv.conf", execPlan{ResolvConf: "/r"}, true},
		{"isolate", execPlan{Isolate: true, Cred: &nsexecCred{UID: 1}}, true},
	} {
		if got := tc.plan.needsHelper(); got != tc.helper {
			t.Errorf("%s: needsHelper = %v, want %v", tc.name, got, tc.helper)
		}
	}
}

// TestIsolateRefusesRoot: root without capabilities still owns root's
// files, so an Isolate spec must name a user that is not uid 0.
func TestIsolateRefusesRoot(t *testing.T) {
	for _, tc := range []struct {
		user string
		ok   bool
	}{
		{"", false},
		{"root", false},
		{"0", false},
		{"0:65534", false},
		{"nobody", true},
		{"65534", true},
		{"65534:65534", true},
	} {
		err := sessiondir.Spec{ID: "x", Argv: []string{"true"}, User: tc.user, Isolate: true}.Validate()
		if tc.ok && err != nil {
			t.Errorf("user %q: got %v, want accepted", tc.user, err)
		}
		if !tc.ok && !errors.Is(err, sessiondir.ErrInvalid) {
			t.Errorf("user %q: got %v, want ErrInvalid", tc.user, err)
		}
	}
	// Start refuses it before starting anything.
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), sessiondir.Spec{ID: "x", Argv: []string{"true"}, Env: shimtest.TestEnv, User: "root", Isolate: true})
	if !errors.Is(err, sessiondir.ErrInvalid) {
		t.Fatalf("start with isolate as root: got %v, want ErrInvalid", err)
	}
}

// runToEnd starts spec, waits for its exit and returns its stdout and exit
// code.
func runToEnd(t *testing.T, spec sessiondir.Spec) (string, int) {
	t.Helper()
	dir, _ := shimtest.Start(t, spec)
	e := shimtest.WaitExit(t, dir)
	return shimtest.StdoutOf(t, dir), e.Code
}

// procStatus parses /proc/PID/status text into its fields.
func procStatus(text string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

var capFields = []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}

// keptBoundingHex is CapBnd of an Isolate command: CAP_NET_RAW only.
const keptBoundingHex = "0000000000002000"

// TestIsolateDropsEverything runs `cat /proc/self/status` as an Isolate
// command of a non-root user: no_new_privs set, every capability set
// empty but the bounding set's CAP_NET_RAW (exec.go, step 5). Without Isolate the same user keeps a full bounding set (the
// control that shows the check can fail).
//
// The shim is started with CAP_NET_RAW inheritable and ambient, which a
// uid change alone keeps in the inheritable set: Isolate must clear it.
func TestIsolateDropsEverything(t *testing.T) {
	shimtest.NeedRoot(t)
	argv := []string{"cat", "/proc/self/status"}
	dir := shimtest.SessionDir(t)
	startWithInheritable(t, dir, sessiondir.Spec{Argv: argv, User: "nobody", Isolate: true})
	code := shimtest.WaitExit(t, dir).Code
	out := shimtest.StdoutOf(t, dir)
	st := procStatus(out)
	if code != 0 || st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" {
		t.Fatalf("isolate: exit %d, NoNewPrivs %q, Seccomp %q, want 0, 1 and 2 (a filter)\n%s", code, st["NoNewPrivs"], st["Seccomp"], out)
	}
	for _, f := range capFields {
		want := "0000000000000000"
		if f == "CapBnd" {
			want = keptBoundingHex
		}
		if st[f] != want {
			t.Errorf("isolate: %s = %q, want %s", f, st[f], want)
		}
	}
	if st["Uid"] != "65534\t65534\t65534\t65534" {
		t.Errorf("isolate: Uid %q, want nobody's throughout", st["Uid"])
	}

	dir = shimtest.SessionDir(t)
	startWithInheritable(t, dir, sessiondir.Spec{Argv: argv, User: "nobody"})
	shimtest.WaitExit(t, dir)
	st = procStatus(shimtest.StdoutOf(t, dir))
	if st["NoNewPrivs"] != "0" || st["CapBnd"] == "0000000000000000" || st["CapInh"] == "0000000000000000" || st["Seccomp"] != "0" {
		t.Fatalf("control without isolate: NoNewPrivs %q CapBnd %q CapInh %q Seccomp %q, want 0, a full set, CAP_NET_RAW, 0", st["NoNewPrivs"], st["CapBnd"], st["CapInh"], st["Seccomp"])
	}
}

// startWithInheritable starts spec's shim from a thread whose inheritable
// and ambient sets hold CAP_NET_RAW (the shim, root, keeps both across its
// execs). The thread is discarded afterwards, never reused.
func startWithInheritable(t *testing.T, dir string, spec sessiondir.Spec) {
	t.Helper()
	done := make(chan error, 1)
	// Owned by this function, which waits for it.
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		data[0].Inheritable |= 1 << unix.CAP_NET_RAW
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			done <- err
			return
		}
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, unix.CAP_NET_RAW, 0, 0); err != nil {
			done <- err
			return
		}
		spec.ID, spec.Env = "t1", shimtest.TestEnv
		st, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, spec)
		if err == nil {
			t.Cleanup(func() { shimtest.WaitGone(t, st.ShimPID) })
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("start with CAP_NET_RAW inheritable: %v", err)
	}
}

// TestIsolateExecsFileCapability: a copy of cat(1) with the file
// capability cap_net_raw=ep (as Debian ships ping) runs as an Isolate
// command, which an empty bounding set refuses (EPERM at execve), and
// gains nothing from it (no_new_privs): its permitted and effective sets
// stay empty.
func TestIsolateExecsFileCapability(t *testing.T) {
	shimtest.NeedRoot(t)
	dir, err := os.MkdirTemp("", "fcap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("/usr/bin/cat")
	if err != nil {
		t.Fatal(err)
	}
	cat := filepath.Join(dir, "cat")
	if err := os.WriteFile(cat, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	// struct vfs_cap_data, revision 2, effective: permitted CAP_NET_RAW.
	fcap := make([]byte, 20)
	const revision2, effective = 0x02000000, 0x000001 // linux/capability.h
	binary.LittleEndian.PutUint32(fcap[0:], revision2|effective)
	binary.LittleEndian.PutUint32(fcap[4:], 1<<unix.CAP_NET_RAW)
	if err := unix.Setxattr(cat, "security.capability", fcap, 0); err != nil {
		t.Skipf("SKIPPED: cannot set a file capability in %s: %v", dir, err)
	}
	out, code := runToEnd(t, sessiondir.Spec{Argv: []string{cat, "/proc/self/status"}, User: "nobody"})
	if st := procStatus(out); code != 0 || st["CapEff"] != "0000000000002000" {
		t.Fatalf("control without isolate: exit %d CapEff %q, want 0 and CAP_NET_RAW (the file capability works here)", code, st["CapEff"])
	}
	out, code = runToEnd(t, sessiondir.Spec{Argv: []string{cat, "/proc/self/status"}, User: "nobody", Isolate: true})
	st := procStatus(out)
	if code != 0 || st["CapPrm"] != "0000000000000000" || st["CapEff"] != "0000000000000000" || st["NoNewPrivs"] != "1" {
		t.Fatalf("isolate: exit %d CapPrm %q CapEff %q NoNewPrivs %q, want 0, none, none, 1\n%s", code, st["CapPrm"], st["CapEff"], st["NoNewPrivs"], out)
	}
}

// TestIsolateDefeatsSetuid: a setuid-root copy of id(1) makes a non-root
// command euid 0, unless the command is isolated.
func TestIsolateDefeatsSetuid(t *testing.T) {
	shimtest.NeedRoot(t)
	dir, err := os.MkdirTemp("", "suid")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Flags&unix.ST_NOSUID != 0 {
		t.Skipf("SKIPPED: %s is on a nosuid mount; the setuid attack cannot be tried here", dir)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	id := filepath.Join(dir, "id")
	src, err := os.Open("/usr/bin/id")
	if err != nil {
		t.Skipf("SKIPPED: no /usr/bin/id to copy: %v", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(id, os.O_WRONLY|os.O_CREATE, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	if err := os.Chown(id, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(id, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}

	out, code := runToEnd(t, sessiondir.Spec{Argv: []string{id, "-u"}, User: "nobody"})
	if code != 0 || out != "0\n" {
		t.Fatalf("control without isolate: got %q exit %d, want euid 0 (the setuid bit works here)", out, code)
	}
	out, code = runToEnd(t, sessiondir.Spec{Argv: []string{id, "-u"}, User: "nobody", Isolate: true})
	if code != 0 || out != "65534\n" {
		t.Fatalf("isolate: got %q exit %d, want euid 65534 (no_new_privs ignores the setuid bit)", out, code)
	}
}

// testCgroup is a cgroup directory a test created: Dir its path, Line the
// /proc/PID/cgroup line that places a process in it.
type testCgroup struct {
	Dir, Line string
}

// makeCgroups creates a uniquely named cgroup in each v1 controller
// hierarchy of ctrls (those mounted at /sys/fs/cgroup/CTRL as v1) and in
// the v2 hierarchy (/sys/fs/cgroup/unified on a hybrid host, else
// /sys/fs/cgroup), and removes them when the test ends (after the
// sessions' cleanups, registered later, have run).
func makeCgroups(t *testing.T, v1 bool, v2 bool) []testCgroup {
	t.Helper()
	name := fmt.Sprintf("runner-shim-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	var cgs []testCgroup
	ids := cgroupIDs(t)
	add := func(mount, ctrl string) {
		dir := filepath.Join(mount, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatalf("create cgroup: %v", err)
		}
		t.Cleanup(func() {
			// The command and its shim are gone by now; a cgroup empties
			// as the kernel finishes reaping, so retry briefly.
			for i := 0; ; i++ {
				err := os.Remove(dir)
				if err == nil || errors.Is(err, os.ErrNotExist) {
					return
				}
				if i == 200 {
					t.Errorf("remove cgroup %s: %v", dir, err)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
		cgs = append(cgs, testCgroup{Dir: dir, Line: fmt.Sprintf("%s:%s:/%s", ids[ctrl], ctrl, name)})
	}
	if v1 {
		for _, ctrl := range []string{"memory", "pids", "cpu"} {
			mount := filepath.Join("/sys/fs/cgroup", ctrl)
			if isV2, err := sessiondir.CgroupKind(mount); err != nil || isV2 {
				t.Skipf("SKIPPED: no cgroup v1 %s hierarchy at %s (pure cgroup v2 host?)", ctrl, mount)
			}
			add(mount, ctrl)
		}
	}
	if v2 {
		mount := "/sys/fs/cgroup/unified"
		if isV2, err := sessiondir.CgroupKind(mount); err != nil || !isV2 {
			mount = "/sys/fs/cgroup"
			if isV2, err := sessiondir.CgroupKind(mount); err != nil || !isV2 {
				t.Skip("SKIPPED: no cgroup v2 hierarchy mounted")
			}
		}
		add(mount, "")
	}
	return cgs
}

// cgroupIDs maps a controller list ("" for v2) to its hierarchy id, from
// this process's /proc/self/cgroup.
func cgroupIDs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 {
			m[f[1]] = f[0]
		}
	}
	return m
}

func dirsOf(cgs []testCgroup) []string {
	var d []string
	for _, c := range cgs {
		d = append(d, c.Dir)
	}
	return d
}

// TestCgroupsPlaceCommand: the command's /proc/self/cgroup, read by the
// command itself (cat is the command), names every given directory, v1
// controllers (through the helper) and the v2 hierarchy (cloned into it,
// also on the direct path), and the shim is in none of them.
func TestCgroupsPlaceCommand(t *testing.T) {
	shimtest.NeedRoot(t)
	for _, tc := range []struct {
		name    string
		v1, v2  bool
		isolate bool
	}{
		{"v1", true, false, false},
		{"v2 direct", false, true, false},
		{"v1 and v2", true, true, false},
		{"v1 and v2 isolated", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cgs := makeCgroups(t, tc.v1, tc.v2)
			spec := sessiondir.Spec{Argv: []string{"cat", "/proc/self/cgroup"}, Cgroups: dirsOf(cgs)}
			if tc.isolate {
				spec.User, spec.Isolate = "nobody", true
			}
			out, code := runToEnd(t, spec)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if code != 0 {
				t.Fatalf("exit %d, output %q", code, out)
			}
			for _, c := range cgs {
				if !slices.Contains(lines, c.Line) {
					t.Errorf("command's /proc/self/cgroup lacks %q:\n%s", c.Line, out)
				}
			}

			// A running command: it is in each directory, the shim in none.
			_, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sleep", "30"}, Cgroups: dirsOf(cgs)})
			shimCg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", st.ShimPID))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cgs {
				procs, err := os.ReadFile(filepath.Join(c.Dir, "cgroup.procs"))
				if err != nil {
					t.Fatal(err)
				}
				pids := strings.Fields(string(procs))
				if !slices.Contains(pids, strconv.Itoa(st.PID)) {
					t.Errorf("%s: cgroup.procs %q lacks the command %d", c.Dir, pids, st.PID)
				}
				if slices.Contains(pids, strconv.Itoa(st.ShimPID)) || strings.Contains(string(shimCg), c.Line+"\n") {
					t.Errorf("%s: the shim %d is in the command's cgroup", c.Dir, st.ShimPID)
				}
			}
		})
	}
}

// TestCgroupsValidate: a cgroup must be absolute, clean, an existing
// cgroup directory, at most one of them v2, and not hold the shim.
func TestCgroupsValidate(t *testing.T) {
	shimtest.NeedRoot(t)
	cgs := makeCgroups(t, true, true) // memory, pids, cpu, v2
	v2root := filepath.Dir(cgs[3].Dir)
	pidsRoot := filepath.Dir(cgs[1].Dir)
	for _, tc := range []struct {
		name string
		dirs []string
		msg  string
	}{
		{"relative", []string{"sys/fs/cgroup/pids"}, "absolute clean"},
		{"unclean", []string{cgs[3].Dir + "/../" + filepath.Base(cgs[3].Dir)}, "absolute clean"},
		{"missing", []string{cgs[3].Dir + "-missing"}, "no such file"},
		{"not a cgroup", []string{t.TempDir()}, "not on a cgroup file system"},
		{"two v2", []string{cgs[3].Dir, v2root}, "more than one cgroup v2"},
		{"two in one v1 hierarchy", []string{cgs[1].Dir, cgs[0].Dir, pidsRoot}, "in one hierarchy"},
		{"holds the shim", []string{v2root}, "holds the shim"},
		{"holds the shim, v1", []string{pidsRoot}, "holds the shim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), sessiondir.Spec{ID: "x", Argv: []string{"true"}, Env: shimtest.TestEnv, Cgroups: tc.dirs})
			if !errors.Is(err, sessiondir.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want ErrInvalid naming %q", err, tc.msg)
			}
		})
	}
}

// BenchmarkStartCommand measures the exec path alone (execCommand until
// the command's execve, plus its wait) for /bin/true: plain is the
// direct path every ordinary session takes; the others show what each
// containment step costs (the helper's re-exec dominates):
//
//	go test -run XXX -bench StartCommand ./shim/
func BenchmarkStartCommand(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIPPED: needs root (cgroups, setuid)")
	}
	name := fmt.Sprintf("runner-shim-bench-%d", os.Getpid())
	var v1 []string
	for _, ctrl := range []string{"memory", "pids", "cpu"} {
		d := filepath.Join("/sys/fs/cgroup", ctrl, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Skipf("SKIPPED: create %s: %v", d, err)
		}
		defer os.Remove(d)
		v1 = append(v1, d)
	}
	v2 := filepath.Join("/sys/fs/cgroup/unified", name)
	if err := os.Mkdir(v2, 0o755); err != nil {
		b.Skipf("SKIPPED: create %s: %v", v2, err)
	}
	defer os.Remove(v2)
	b.Run("baseline-cmd.Start", func(b *testing.B) {
		// What the direct path was before the step list: exec.Cmd.Start.
		for b.Loop() {
			cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Env: []string{}}
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			cmd.Wait()
		}
	})
	for _, bc := range []struct {
		name string
		spec sessiondir.Spec
	}{
		{"plain", sessiondir.Spec{}},
		{"cgroup-v2", sessiondir.Spec{Cgroups: []string{v2}}},
		{"cgroups-v1", sessiondir.Spec{Cgroups: v1}},
		{"isolate", sessiondir.Spec{User: "nobody", Isolate: true}},
	} {
		for _, ahead := range []bool{false, true} {
			name := bc.name
			if ahead {
				if !bc.spec.NeedsHelper() {
					continue
				}
				name += "-ahead"
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					// A helper started ahead (as a warm shim does, while
					// it waits) is outside the timed path: what a start
					// through it costs.
					var h *nsexecAhead
					if ahead {
						b.StopTimer()
						var err error
						if h, err = startNsexecAhead(); err != nil {
							b.Fatal(err)
						}
						if err := h.awaitUp(nsexecUpTimeout); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
					stdin, _ := os.Open(os.DevNull)
					cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Env: []string{}, Stdin: stdin, Stdout: stdin, Stderr: stdin}
					cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
					if bc.spec.User != "" {
						cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}
					}
					if err := execCommand(cmd, bc.spec, h, nil); err != nil {
						b.Fatal(err)
					}
					if ahead && !h.used {
						b.Fatal("the helper started ahead was not used")
					}
					cmd.Process.Wait()
					stdin.Close()
				}
			})
		}
	}
}

// TestPoolIsolateCgroups: a warm shim given an Isolate spec with Cgroups
// (the spec travels as JSON to a shim started before it) takes the same
// exec path as a cold start.
// It runs with a helper forked for the start (the default pool's first
// start) and with one its warm shim started ahead.
func TestPoolIsolateCgroups(t *testing.T) {
	shimtest.NeedRoot(t)
	cgs := makeCgroups(t, true, true)
	for _, mode := range []launch.HelperMode{launch.HelperAuto, launch.HelperAlways} {
		t.Run(fmt.Sprint("helper mode ", mode), func(t *testing.T) { testPoolIsolateCgroups(t, cgs, mode) })
	}
}

func testPoolIsolateCgroups(t *testing.T, cgs []testCgroup, mode launch.HelperMode) {
	p := launch.NewPool(shimtest.ShimExe, launch.PoolOptions{Size: 1, Root: shimtest.PoolRoot(t), Helper: mode})
	t.Cleanup(func() { p.Close() })
	shimtest.WaitWarm(t, p, 1)
	dir := shimtest.PoolDir(t, p)
	st, err := p.Start(shimtest.CtxT(t, 10*time.Second), dir, sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, User: "nobody", Isolate: true,
		Cgroups: dirsOf(cgs), Argv: []string{"sh", "-c", "grep -E '^(NoNewPrivs|CapBnd):' /proc/self/status; cat /proc/self/cgroup"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shimtest.WaitGone(t, st.ShimPID) })
	if e := shimtest.WaitExit(t, dir); e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	out := shimtest.StdoutOf(t, dir)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, want := range []string{"NoNewPrivs:\t1", "CapBnd:\t" + keptBoundingHex} {
		if !slices.Contains(lines, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, c := range cgs {
		if !slices.Contains(lines, c.Line) {
			t.Errorf("output lacks %q:\n%s", c.Line, out)
		}
	}
}

// TestIsolateDirBehindClosedParent: an Isolate command's working
// directory, its own (nobody's, 0700), lies under a directory only root
// may pass (0700, as root's home or a test's temporary directory): the
// command starts there and reads its files, because the helper opens its
// DirRoot as root before the user switch and fchdirs after it; a
// directory the user may not enter itself still fails the start, and
// without a DirRoot the user's own chdir cannot pass the parent.
func TestIsolateDirBehindClosedParent(t *testing.T) {
	shimtest.NeedRoot(t)
	closed := t.TempDir()
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(closed, "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "f"), []byte("mine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ws, filepath.Join(ws, "f")} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, Dir: ws, User: "nobody", Isolate: true})
	if !errors.Is(err, unix.EACCES) {
		t.Fatalf("start in %s without a DirRoot as nobody: %v, want EACCES (root opens no path but the DirRoot)", ws, err)
	}
	out, code := runToEnd(t, sessiondir.Spec{Argv: []string{"sh", "-c", "pwd; cat f"}, Dir: ws, DirRoot: ws, User: "nobody", Isolate: true})
	if code != 0 || out != ws+"\nmine\n" {
		t.Fatalf("isolate in %s: exit %d output %q, want 0 and %q", ws, code, out, ws+"\nmine\n")
	}
	// The directory itself must still let the user in.
	if err := os.Chown(ws, 0, 0); err != nil {
		t.Fatal(err)
	}
	dir := shimtest.SessionDir(t)
	_, err = shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "t1", Env: shimtest.TestEnv, Argv: []string{"true"}, Dir: ws, DirRoot: ws, User: "nobody", Isolate: true})
	if !errors.Is(err, unix.EACCES) {
		t.Fatalf("start in root's 0700 %s as nobody: %v, want EACCES", ws, err)
	}
}
