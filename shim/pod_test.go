package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// podBase is the first id of the blocks these tests map (pod's own tests
// use 0x60000000).
const podBase = 0x61000000

// testPod is a pod made by the test binary (its own holder program: the
// shim's pod mode) and its directories.
type testPod struct {
	*pod.Pod
	cfg pod.Config
}

// newPod makes a pod named name with block k of podBase and destroys it
// at the test's end.
func newPod(t *testing.T, name string, k int) *testPod {
	t.Helper()
	shimtest.NeedRoot(t)
	root := t.TempDir()
	// /proc/self/exe: the go build directory above the test binary is
	// root's, 0700, which the holder cannot pass.
	cfg := pod.Config{Holder: []string{"/proc/self/exe", "pod"}, Env: []string{shimtest.AsShimEnv + "=1", "GORACE=atexit_sleep_ms=0"},
		Name: name, UIDBase: podBase + uint32(k)*pod.BlockSize}
	for _, d := range []*string{&cfg.Upper, &cfg.Workspace, &cfg.Tmp, &cfg.VarTmp} {
		dir, err := os.MkdirTemp(root, "d")
		if err != nil {
			t.Fatal(err)
		}
		*d = dir
	}
	p, err := pod.Create(shimtest.CtxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("pod.Create: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(shimtest.CtxT(t, 30*time.Second)); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return &testPod{p, cfg}
}

func (p *testPod) ref() *sessiondir.PodRef {
	return &sessiondir.PodRef{PID: p.PID(), StartTime: p.StartTime()}
}

// runIn runs sh -c script in the pod through a shim and returns its exit
// and its stdout and stderr merged.
func runIn(t *testing.T, p *testPod, script string) (journal.Exit, string) {
	t.Helper()
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", script}, Pod: p.ref(), MergeStderr: true, Dir: pod.WorkspacePath})
	e := shimtest.WaitExit(t, dir)
	return e, shimtest.StdoutOf(t, dir)
}

// TestPodProcesses: a command in a pod sees only the pod's processes:
// the holder (pid 1), itself and its children; no host process (the
// shim, this test) is visible, readable or signalable by its host pid.
func TestPodProcesses(t *testing.T) {
	p := newPod(t, "procs", 0)
	host := os.Getpid()
	e, out := runIn(t, p, fmt.Sprintf(`ps -e -o pid=,comm=
ls /proc | grep -c '^[0-9]'
cat /proc/%[1]d/environ; echo environ $?
kill -0 %[1]d; echo kill $?
kill -0 %[2]d; echo kill-holder $?`, host, p.PID()))
	if e.Reason != journal.ReasonExited || e.Code != 0 {
		t.Fatalf("exit %+v, want 0; output:\n%s", e, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var procs []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] != "environ" && f[0] != "kill" && f[0] != "kill-holder" {
			if _, err := strconv.Atoi(f[0]); err == nil {
				procs = append(procs, f[0]+" "+f[1])
			}
		}
	}
	// ps (the last) and sh, pid 1 the holder: its comm is the test binary's.
	if len(procs) != 3 || !strings.HasPrefix(procs[0], "1 ") || !strings.HasSuffix(procs[1], " sh") || !strings.HasSuffix(procs[2], " ps") {
		t.Errorf("ps -e in the pod: got %q, want the holder (1), sh and ps only", procs)
	}
	want := []string{"environ 1", "kill 1", "kill-holder 1"}
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("got output\n%s\nwant a line %q (host pids %d, %d neither readable nor signalable)", out, w, host, p.PID())
		}
	}
}

// TestPodRootInsideNobodyOutside: uid 0 inside is the block's first id
// outside; what it writes in the workspace is that id's.
func TestPodRootInsideNobodyOutside(t *testing.T) {
	p := newPod(t, "ids", 1)
	dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", "id -u > /workspace/id; exec sleep 60"}, Pod: p.ref()})
	base := int(p.cfg.UIDBase)
	var got []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got, _ = os.ReadFile(filepath.Join(p.cfg.Workspace, "id")); len(got) > 0 {
			break
		}
	}
	if string(got) != "0\n" {
		t.Fatalf("id -u in the pod: got %q, want 0", got)
	}
	var fst syscall.Stat_t
	if err := syscall.Stat(filepath.Join(p.cfg.Workspace, "id"), &fst); err != nil || int(fst.Uid) != base || int(fst.Gid) != base {
		t.Errorf("the file root inside wrote: owner %d:%d (%v), want %d:%d", fst.Uid, fst.Gid, err, base, base)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.PID))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Uid:\t%[1]d\t%[1]d\t%[1]d\t%[1]d\n", base)
	if !strings.Contains(string(status), want) {
		t.Errorf("the command seen from the host: want %q in\n%s", want, status)
	}
	if pp := shimtest.ParentOf(t, st.PID); pp != st.ShimPID {
		t.Errorf("the command's parent: got %d, want the shim %d", pp, st.ShimPID)
	}
	syscall.Kill(st.PID, syscall.SIGKILL)
	if e := shimtest.WaitExit(t, dir); e.Reason != journal.ReasonSignaled || e.Signal != 9 {
		t.Errorf("after SIGKILL: got %+v, want signaled 9", e)
	}
}

// TestPodExitCode: the shim, the command's parent, has its exit code.
func TestPodExitCode(t *testing.T) {
	p := newPod(t, "exit", 2)
	if e, out := runIn(t, p, "exit 7"); e.Reason != journal.ReasonExited || e.Code != 7 {
		t.Errorf("got %+v (%q), want exited 7", e, out)
	}
	if e, out := runIn(t, p, "no-such-command-here"); e.Code != 127 {
		t.Errorf("a missing command: got %+v (%q), want 127", e, out)
	}
}

// TestPodRoot: the root shows the listed system directories and the
// pod's own mount points, nothing else of the host's.
func TestPodRoot(t *testing.T) {
	p := newPod(t, "root", 3)
	e, out := runIn(t, p, fmt.Sprintf(`ls -A /; echo ---; ls -A /root; echo ---; ls -d /work %s 2>&1 | wc -l; cat /etc/shadow >/dev/null 2>&1; echo shadow $?`, filepath.Dir(p.cfg.Upper)))
	if e.Code != 0 {
		t.Fatalf("exit %+v:\n%s", e, out)
	}
	parts := strings.Split(out, "---\n")
	want := []string{"bin", "dev", "etc", "home", "mnt", "opt", "proc", "root", "run", "sbin", "srv", "tmp", "usr", "var", "workspace"}
	libs, _ := filepath.Glob("/lib*")
	for _, l := range libs {
		want = append(want, filepath.Base(l))
	}
	slices.Sort(want)
	if got := strings.Fields(parts[0]); !slices.Equal(got, want) {
		t.Errorf("ls -A /: got %q, want %q", got, want)
	}
	if got := strings.TrimSpace(parts[1]); got != "" {
		t.Errorf("ls -A /root: got %q, want it empty", got)
	}
	if got := parts[2]; got != "2\nshadow 1\n" {
		t.Errorf("got %q, want /work and the test's directory absent (2 errors) and /etc/shadow unreadable", got)
	}
}

// TestPodUpperLayer: root inside can install into /usr/local; the file
// lands in the pod's upper layer, owned by the block's root, never on the
// host's /usr/local.
func TestPodUpperLayer(t *testing.T) {
	p := newPod(t, "upper", 4)
	name := fmt.Sprintf("pod-test-%d", os.Getpid())
	if e, out := runIn(t, p, "echo installed > /usr/local/"+name+" && cat /usr/local/"+name); e.Code != 0 || out != "installed\n" {
		t.Fatalf("write /usr/local/%s in the pod: %+v %q", name, e, out)
	}
	if _, err := os.Lstat("/usr/local/" + name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the host's /usr/local/%s: got %v, want absent", name, err)
	}
	f := filepath.Join(p.cfg.Upper, "usr", "upper", "local", name)
	var st syscall.Stat_t
	if err := syscall.Stat(f, &st); err != nil || st.Uid != p.cfg.UIDBase || st.Gid != p.cfg.UIDBase {
		t.Errorf("%s: owner %d:%d (%v), want %d:%d", f, st.Uid, st.Gid, err, p.cfg.UIDBase, p.cfg.UIDBase)
	}
}

// TestPodIPC: SysV shared memory made in one pod is not seen in another
// (nor on the host).
func TestPodIPC(t *testing.T) {
	a, b := newPod(t, "ipc-a", 5), newPod(t, "ipc-b", 6)
	if e, out := runIn(t, a, "ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null && ipcs -m | grep -c '^0x'; ipcs -q | grep -c '^0x'"); e.Code != 0 || out != "1\n1\n" {
		t.Fatalf("in pod a: %+v %q, want one segment and one queue", e, out)
	}
	if e, out := runIn(t, b, "ipcs -m | grep -c '^0x'; ipcs -q | grep -c '^0x'"); out != "0\n0\n" {
		t.Errorf("in pod b: %+v %q, want no segment and no queue", e, out)
	}
}

// TestPodDenied: the seccomp filter holds in a pod, where root has every
// capability of its user namespace: no new namespace, no mount; the host
// name is the pod's.
func TestPodDenied(t *testing.T) {
	p := newPod(t, "denied", 7)
	e, out := runIn(t, p, `hostname; unshare -U true 2>/dev/null; echo unshare $?; mount -t tmpfs t /mnt 2>/dev/null; echo mount $?; umount /proc 2>/dev/null; echo umount $?`)
	if want := "denied\nunshare 1\nmount 32\numount 32\n"; out != want || e.Code != 0 {
		t.Errorf("got %+v %q, want %q", e, out, want)
	}
}

// TestPodOrphans: a process the command leaves behind is reparented to
// the holder, the pod's init, which reaps it: no zombie stays.
func TestPodOrphans(t *testing.T) {
	p := newPod(t, "orphans", 8)
	if e, out := runIn(t, p, "sh -c 'sleep 0.2; exit 3' & exit 0"); e.Code != 0 {
		t.Fatalf("%+v %q", e, out)
	}
	var out string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		// The orphan's sleep has ended; its sh is reaped or a zombie.
		_, out = runIn(t, p, "ps -e -o stat=,comm= | grep -v 'ps$' | grep -c '^Z'; ps -e -o comm= | grep -c sleep")
		if out == "0\n0\n" {
			return
		}
	}
	t.Errorf("zombies, sleeps in the pod: got %q, want 0 and 0 (the holder reaps orphans)", out)
}

// TestPodHolderSignals: the holder, pid 1 of the pod, survives every
// signal root inside can send it.
func TestPodHolderSignals(t *testing.T) {
	p := newPod(t, "signals", 9)
	e, out := runIn(t, p, "for s in $(seq 1 31); do kill -s $s 1 2>/dev/null; done; sleep 0.2; echo done")
	if e.Code != 0 || out != "done\n" {
		t.Fatalf("%+v %q", e, out)
	}
	if err := syscall.Kill(p.PID(), 0); err != nil {
		t.Fatalf("holder after signals from inside: %v", err)
	}
	if e, out := runIn(t, p, "echo alive"); out != "alive\n" {
		t.Errorf("a session after the signals: %+v %q", e, out)
	}
}

// TestPodGone: a Spec naming a holder that is gone, or a pid that is not
// that holder (another start time), fails the start and runs nothing.
func TestPodGone(t *testing.T) {
	p := newPod(t, "gone", 10)
	ref := p.ref()
	ref.StartTime++
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t),
		sessiondir.Spec{ID: "t1", Argv: []string{"true"}, Env: shimtest.TestEnv, Pod: ref})
	if err == nil || !strings.Contains(err.Error(), "not the holder") {
		t.Errorf("start with a wrong start time: got %v, want a refusal naming the holder", err)
	}
}

// TestPodCgroups: the holder is placed in the sandbox's cgroup before it
// makes its cgroup namespace, so inside the sandbox's directory is "/";
// a session given a leaf below it runs there (the join writes the cgroup
// v1 tasks file before it enters the pod), seen inside as "/LEAF".
func TestPodCgroups(t *testing.T) {
	shimtest.NeedRoot(t)
	const hier = "/sys/fs/cgroup/pids"
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(hier, &sfs); err != nil || sfs.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
		t.Skip("no cgroup v1 pids hierarchy here: the v2 path (CLONE_INTO_CGROUP) is the one this host cannot show")
	}
	sandbox := filepath.Join(hier, fmt.Sprintf("runner-podtest-%d", os.Getpid()))
	leaf := filepath.Join(sandbox, "s1")
	for _, d := range []string{sandbox, leaf} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { os.Remove(leaf); os.Remove(sandbox) }) // after the pod's Destroy (cleanups run last first)
	// A hybrid host's unified hierarchy too, when there is one: the
	// holder and the helper are cloned into it (CLONE_INTO_CGROUP).
	const unified = "/sys/fs/cgroup/unified"
	var v2, v2leaf string
	if err := syscall.Statfs(unified, &sfs); err == nil && sfs.Type == 0x63677270 {
		v2, v2leaf = filepath.Join(unified, filepath.Base(sandbox)), filepath.Join(unified, filepath.Base(sandbox), "s1")
		for _, d := range []string{v2, v2leaf} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { os.Remove(v2leaf); os.Remove(v2) })
	}
	root := t.TempDir()
	cfg := pod.Config{Holder: []string{"/proc/self/exe", "pod"}, Env: []string{shimtest.AsShimEnv + "=1", "GORACE=atexit_sleep_ms=0"},
		Name: "cgroups", UIDBase: podBase + 30*pod.BlockSize, Cgroups: []string{sandbox}}
	leaves := []string{leaf}
	if v2 != "" {
		cfg.Cgroups, leaves = append(cfg.Cgroups, v2), append(leaves, v2leaf)
	}
	for _, d := range []*string{&cfg.Upper, &cfg.Workspace, &cfg.Tmp, &cfg.VarTmp} {
		dir, err := os.MkdirTemp(root, "d")
		if err != nil {
			t.Fatal(err)
		}
		*d = dir
	}
	pp, err := pod.Create(shimtest.CtxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("pod.Create: %v", err)
	}
	t.Cleanup(func() { pp.Destroy(shimtest.CtxT(t, 30*time.Second)) })
	p := &testPod{pp, cfg}
	hc, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.PID()))
	if err != nil || !strings.Contains(string(hc), ":pids:/"+filepath.Base(sandbox)+"\n") {
		t.Errorf("the holder's cgroups seen from the host: %q (%v), want pids:/%s", hc, err, filepath.Base(sandbox))
	}
	if v2 != "" && !strings.Contains(string(hc), "\n0::/"+filepath.Base(sandbox)+"\n") {
		t.Errorf("the holder's cgroups seen from the host: %q, want 0::/%s", hc, filepath.Base(sandbox))
	}
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", "grep ':pids:\\|^0::' /proc/self/cgroup; grep ':pids:\\|^0::' /proc/1/cgroup"},
		Pod: p.ref(), Cgroups: leaves})
	if e := shimtest.WaitExit(t, dir); e.Code != 0 {
		t.Fatalf("exit %+v", e)
	}
	out := shimtest.StdoutOf(t, dir)
	want := `^\d+:pids:/s1\n\d+:pids:/\n$`
	if v2 != "" {
		want = `^\d+:pids:/s1\n0::/s1\n\d+:pids:/\n0::/\n$`
	}
	if !regexp.MustCompile(want).MatchString(out) {
		t.Errorf("inside the pod: got %q, want the session in /s1 and the holder in / of its cgroup namespace", out)
	}
}

// TestPodSpecValidate: what a pod has of its own is refused per spawn,
// and a pod's user is numeric ids of its namespace.
func TestPodSpecValidate(t *testing.T) {
	ref := &sessiondir.PodRef{PID: 1, StartTime: 1}
	for _, tc := range []struct {
		name string
		edit func(*sessiondir.Spec)
		ok   bool
	}{
		{"root by default", func(*sessiondir.Spec) {}, true},
		{"uid:gid", func(s *sessiondir.Spec) { s.User = "1000:100" }, true},
		{"a name", func(s *sessiondir.Spec) { s.User = "root" }, false},
		{"an id past the block", func(s *sessiondir.Spec) { s.User = "65536" }, false},
		{"netns", func(s *sessiondir.Spec) { s.NetNS = "/run/netns/x" }, false},
		{"binds", func(s *sessiondir.Spec) { s.Binds = []sessiondir.Bind{{Source: "/a", Target: "/b"}} }, false},
		{"hostname", func(s *sessiondir.Spec) { s.Hostname = "x" }, false},
		{"isolate", func(s *sessiondir.Spec) { s.Isolate, s.User = true, "1000" }, false},
		{"cwd_root", func(s *sessiondir.Spec) { s.DirRoot, s.Dir = "/w", "/w" }, false},
		{"no pid", func(s *sessiondir.Spec) { s.Pod = &sessiondir.PodRef{} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sessiondir.Spec{ID: "t1", Argv: []string{"true"}, Pod: ref}
			tc.edit(&s)
			err := s.Validate()
			if tc.ok && err != nil || !tc.ok && !errors.Is(err, sessiondir.ErrInvalid) {
				t.Errorf("got %v, want ok=%v (else ErrInvalid)", err, tc.ok)
			}
		})
	}
}

// TestPodTTY: a session with a terminal in a pod leads its own session
// with the terminal as its controlling one (the join's first process
// takes neither: its exit would hang the terminal up).
func TestPodTTY(t *testing.T) {
	p := newPod(t, "tty", 11)
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", `test -t 0 && echo istty; set -- $(cut -d')' -f2 /proc/$$/stat); echo "sid=$(($4==$$)) tty=$(($5!=0))"; exit 3`},
		Pod: p.ref(), TTY: true})
	e := shimtest.WaitExit(t, dir)
	out := strings.ReplaceAll(shimtest.StdoutOf(t, dir), "\r", "")
	if e.Code != 3 || out != "istty\nsid=1 tty=1\n" {
		t.Errorf("got %+v %q, want exit 3 and \"istty\\nsid=1 tty=1\\n\"", e, out)
	}
}

// TestPodHolderFiltered: root inside can ptrace the holder (its memory
// is the pod's user namespace's); code it injects there runs under the
// same seccomp filter as its own. The attack: gdb attached to pid 1 turns
// the holder's thread, stopped just after a syscall instruction, into an
// unshare(CLONE_NEWNS), which the filter denies the pod's commands.
func TestPodHolderFiltered(t *testing.T) {
	p := newPod(t, "ptrace", 13)
	e, out := runIn(t, p, `grep '^NoNewPrivs:\|^Seccomp:' /proc/1/status`)
	if want := "NoNewPrivs:\t1\nSeccomp:\t2\n"; e.Code != 0 || out != want {
		t.Errorf("the holder's /proc/1/status: got %q, want %q", out, want)
	}
	if _, err := exec.LookPath("gdb"); err != nil {
		testcap.Skip(t, "gdb", "the injection into the holder is done with gdb (.ci/run installs it)")
	}
	e, out = runIn(t, p, `gdb -nx -p 1 -batch -ex 'x/i $pc-2' -ex 'set $rax=272' -ex 'set $rdi=0x20000' -ex 'set $pc=$pc-2' -ex 'stepi' -ex 'p (long)$rax' 2>&1 | grep -E 'syscall|^\$1'`)
	if !strings.Contains(out, "syscall") {
		t.Fatalf("the holder is not stopped after a syscall instruction (%+v):\n%s", e, out)
	}
	if !strings.Contains(out, "$1 = -1\n") { // -EPERM
		t.Errorf("unshare(CLONE_NEWNS) injected into the holder: got\n%s\nwant $1 = -1 (EPERM, the filter)", out)
	}
}
