package daemon_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
)

// startPods starts runnerd as its own process with every sandbox a pod
// (--isolate pod), contained in lab, and returns it with its state
// directory. Its pods are ended at cleanup (killPods) whatever the test
// did to runnerd.
func startPods(t *testing.T, lab *netlab.Lab, args ...string) (*api, *proc, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "a pod maps a block of ids and mounts its root")
	}
	state := passableTempDir(t)
	t.Cleanup(func() { killPods(t, state) })
	netState := netStateDir(t)
	a, p := startRunnerdProc(t, lab, state, netState, append([]string{"--isolate", "pod"}, args...)...)
	return a, p, state, netState
}

// killPods kills the holders STATE/pods names (each checked by its start
// time: only a holder this test's runnerd made), which ends each pod's
// processes with it: a runnerd a test killed leaves its pods running, as
// it leaves its shims.
func killPods(t *testing.T, state string) {
	files, _ := filepath.Glob(filepath.Join(state, "pods", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var pid int
		var start uint64
		if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil || pid <= 1 {
			continue
		}
		if st, err := startTimeOf(pid); err == nil && st == start {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// startTimeOf is field 22 of /proc/PID/stat.
func startTimeOf(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	return strconv.ParseUint(f[19], 10, 64)
}

// statusField returns field key of /proc/PID/status ("Uid:" ...).
func statusField(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return ""
}

// TestPodSandbox: under --isolate pod a sandbox created with no options is
// a pod: root inside and its block's first id outside, its own processes,
// root, host name and IPC; what root installs persists across park,
// resume and a runnerd kill -9, in it alone, and destroy leaves nothing.
func TestPodSandbox(t *testing.T) {
	lab := netlab.New(t)
	t0 := t
	shared := t.TempDir() // an operator's directory, bound into every pod
	if err := os.WriteFile(filepath.Join(shared, "tool.conf"), []byte("from the operator\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(shared, 0o755)
	a, p, state, netState := startPods(t, lab, "--bind", shared+":/opt/operator")
	run := a.subtests(t)
	var one, two wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "one"}, 200, &one)
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "two"}, 200, &two)
	if !one.Pod || one.Workspace != "/workspace" || one.HostWorkspace == "" || one.UID == nil || *one.UID == 0 ||
		two.UID == nil || *two.UID-*one.UID == 0 || (*two.UID-*one.UID)%65536 != 0 {
		t.Fatalf("pod sandboxes: %+v %+v: want pods with blocks of their own", one, two)
	}
	base := *one.UID

	run("root inside, its block outside", func(t *testing.T) {
		if got := a.run("one", "id", "-u"); got != "0" {
			t.Errorf("id -u = %q, want 0", got)
		}
		s := a.spawn("one", wire.CreateSession{Argv: []string{"sleep", "60"}})
		if got, want := statusField(t, s.PID, "Uid:"), fmt.Sprintf("%d %d %d %d", base, base, base, base); got != want {
			t.Errorf("the command seen from the host: Uid %q, want %q", got, want)
		}
		if got := statusField(t, s.PID, "CapEff:"); got != "000001ffffffffff" && got != "000003ffffffffff" && !strings.HasPrefix(got, "0000") {
			t.Errorf("CapEff %q", got)
		}
		a.do("POST", "/v1/sandboxes/one/sessions/"+s.ID+"/signal", `{"signal":"KILL"}`)
	})
	run("an operator's bind, read-only", func(t *testing.T) {
		if got := a.run("two", "cat", "/opt/operator/tool.conf"); got != "from the operator" {
			t.Errorf("the bind inside: %q", got)
		}
		res := a.exec("two", wire.Exec{Argv: []string{"sh", "-c", "echo x > /opt/operator/tool.conf"}})
		if res.Exit.Code == 0 || !strings.Contains(string(res.Stderr), "Read-only file system") {
			t.Errorf("root writing the read-only bind: %+v %q, want Read-only file system", res.Exit, res.Stderr)
		}
		if b, _ := os.ReadFile(filepath.Join(shared, "tool.conf")); string(b) != "from the operator\n" {
			t.Errorf("the host's file after the write: %q", b)
		}
	})
	run("a session's user", func(t *testing.T) {
		for _, c := range []struct{ user, want string }{{"nobody", "65534 65534"}, {"1000", "1000 1000"}, {"1000:5", "1000 5"}, {"", "0 0"}} {
			res := a.exec("one", wire.Exec{Argv: []string{"sh", "-c", "echo $(id -u) $(id -g)"}, User: c.user})
			if got := strings.TrimSpace(string(res.Stdout)); got != c.want || res.Exit.Code != 0 {
				t.Errorf("user %q: %q %+v, want %q", c.user, got, res.Exit, c.want)
			}
		}
		for _, bad := range []string{"65536", "no-such-user-x", "1:2:3"} {
			a.wantError(a.do("POST", "/v1/sandboxes/one/exec", wire.Exec{Argv: []string{"true"}, User: bad}), 400, wire.CodeInvalid)
		}
	})
	run("a terminal of its own devpts", func(t *testing.T) {
		s := a.spawn("one", wire.CreateSession{Argv: []string{"sh", "-c", "tty; stty size"}, TTY: true, Rows: 40, Cols: 120})
		got := a.attach(t.Context(), "one", s.ID, "", nil)
		if out := strings.ReplaceAll(string(got.streams["stdout"]), "\r", ""); !strings.HasPrefix(out, "/dev/pts/") || !strings.HasSuffix(out, "\n40 120\n") {
			t.Errorf("tty; stty size in a pod: %q, want /dev/pts/N and 40 120", out)
		}
	})
	run("terminate stops a session's leftovers", func(t *testing.T) {
		// The shell exits at once; its background sleep is reparented to
		// the pod's init (the holder), not to the session's shim: the
		// shim finds it by the session's cgroup leaf.
		s := a.spawn("one", wire.CreateSession{Argv: []string{"sh", "-c", "sleep 300 >/dev/null 2>&1 & echo started"}})
		a.waitEnded("one", s.ID)
		if got := a.run("one", "sh", "-c", "ps -eo comm= | grep -c '^sleep$' || true"); got != "1" {
			t.Fatalf("the leftover sleep before terminate: %s running, want 1", got)
		}
		a.must("POST", "/v1/sandboxes/one/sessions/"+s.ID+"/terminate", `{"grace_ms":200}`, 200, nil)
		if got := a.run("one", "sh", "-c", "ps -eo comm= | grep -c '^sleep$' || true"); got != "0" {
			t.Errorf("the leftover sleep after terminate: %s running, want 0", got)
		}
	})
	run("its own processes", func(t *testing.T) {
		s := a.spawn("two", wire.CreateSession{Argv: []string{"sleep", "60"}})
		defer a.do("POST", "/v1/sandboxes/two/sessions/"+s.ID+"/signal", `{"signal":"KILL"}`)
		ps := a.run("one", "ps", "-e", "-o", "pid=,comm=")
		var pids, comms []string
		for _, line := range strings.Split(ps, "\n") {
			if f := strings.Fields(line); len(f) == 2 {
				pids, comms = append(pids, f[0]), append(comms, f[1])
			}
		}
		// The holder (pid 1, the shim program in its pod mode) and ps
		// itself: nothing of the host, of runnerd, of the shims, or of
		// the other pod's sleep.
		if len(comms) != 2 || pids[0] != "1" || comms[1] != "ps" || slices.Contains(comms, "sleep") {
			t.Errorf("ps -e in a pod lists %q, want the holder (pid 1) and ps", ps)
		}
		if got := a.run("one", "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"); !strings.HasSuffix(got, " pod") {
			t.Errorf("pid 1 in a pod: %q, want the holder", got)
		}
	})
	run("its own root and host name", func(t *testing.T) {
		ls := strings.Fields(a.run("one", "ls", "-A", "/"))
		for _, name := range ls {
			switch name {
			case "bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "opt", "proc", "root", "run", "sbin", "srv", "sys", "tmp", "usr", "var", "workspace", "home", "mnt", "media":
			default:
				t.Errorf("ls / in a pod shows %q (all: %q)", name, ls)
			}
		}
		if got := a.run("one", "sh", "-c", "ls -A /root /home 2>/dev/null | grep -v ':$' | grep -c . || true"); got != "0" {
			t.Errorf("/root or /home of the host visible: %s entries", got)
		}
		if got := a.run("one", "sh", "-c", "grep ^nameserver /etc/resolv.conf"); !strings.HasPrefix(got, "nameserver 10.") {
			t.Errorf("resolv.conf in a contained pod: %q, want its own resolver", got)
		}
		if got := a.run("one", "hostname"); got != "one" {
			t.Errorf("hostname = %q, want one", got)
		}
		for _, p := range []string{state, filepath.Join(state, "token"), "/work", "/run/runnerd"} {
			res := a.exec("one", wire.Exec{Argv: []string{"test", "-e", p}})
			if res.Exit.Code != 1 {
				t.Errorf("test -e %s in a pod: exit %+v, want 1 (absent)", p, res.Exit)
			}
		}
	})
	run("apt-get install, in its pod alone", func(t *testing.T) {
		deb := buildPodDeb(t)
		if err := os.WriteFile(filepath.Join(one.HostWorkspace, "podtest.deb"), deb, 0o644); err != nil {
			t.Fatal(err)
		}
		res := a.exec("one", wire.Exec{Argv: []string{"apt-get", "install", "-y", "/workspace/podtest.deb"}, TimeoutMS: 120000,
			Env: []string{"DEBIAN_FRONTEND=noninteractive"}})
		if res.Exit.Code != 0 {
			t.Fatalf("apt-get install in a pod: %+v\n%s\n%s", res.Exit, res.Stdout, res.Stderr)
		}
		if got := a.run("one", "sh", "-c", podDebCheck); got != "install ok installed\ninstalled\nconfigured" {
			t.Errorf("after apt-get install: %q", got)
		}
		for _, p := range []string{"/usr/share/podtest", "/etc/podtest.conf"} {
			if _, err := os.Stat(p); err == nil {
				t.Fatalf("%s, installed in a pod, is on the host", p)
			}
		}
		if got := a.run("two", "sh", "-c", podDebCheck+" 2>&1 || true"); strings.Contains(got, "installed\n") {
			t.Errorf("pod two sees pod one's package: %q", got)
		}
		a.run("one", "sh", "-c", "echo ws > /workspace/f && mkdir -p /workspace/sub")
		fi, err := os.Stat(filepath.Join(one.HostWorkspace, "f"))
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != base {
			t.Errorf("workspace file on the host: %v %v, want owned by %d", fi, err, base)
		}
		if got := a.run("one", "sh", "-c", "cat /workspace/f; echo $HOME"); got != "ws\n/workspace" {
			t.Errorf("workspace and HOME inside: %q", got)
		}
		res = a.exec("one", wire.Exec{Argv: []string{"pwd"}, Cwd: "sub"})
		if string(res.Stdout) != "/workspace/sub\n" {
			t.Errorf("pwd with cwd sub: %q %+v", res.Stdout, res.Exit)
		}
		res = a.exec("one", wire.Exec{Argv: []string{"pwd"}, Cwd: filepath.Join(one.HostWorkspace, "sub")})
		if string(res.Stdout) != "/workspace/sub\n" {
			t.Errorf("pwd with cwd the host path of sub: %q %+v", res.Stdout, res.Exit)
		}
		a.wantError(a.do("POST", "/v1/sandboxes/one/exec", wire.Exec{Argv: []string{"pwd"}, Cwd: "../.."}), 400, wire.CodeInvalid)
	})
	run("IPC of its own", func(t *testing.T) {
		id := a.run("one", "ipcmk", "-M", "4096")
		if !strings.Contains(id, "Shared memory id") {
			t.Fatalf("ipcmk: %q", id)
		}
		if got := a.run("two", "sh", "-c", "ipcs -m | grep -c '^0x' || true"); got != "0" {
			t.Errorf("pod two sees %s shared memory segments (pod one made one)", got)
		}
	})
	run("a holder nobody recorded is ended", func(t *testing.T) {
		// A runnerd killed between a holder's start and its record leaves
		// a holder in the sandbox's _pod leaf that no record names. Played
		// here by a process put in that leaf, and the recorded holder
		// killed: the next spawn makes the pod again, and the leftover
		// goes first.
		b, err := os.ReadFile(filepath.Join(state, "pods", "two"))
		if err != nil {
			t.Fatal(err)
		}
		var holder int
		fmt.Sscanf(string(b), "%d", &holder)
		leaf := ""
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", holder))
		for _, line := range strings.Split(string(cg), "\n") {
			if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "pids" {
				leaf = "/sys/fs/cgroup/pids" + f[2]
			}
		}
		if !strings.HasSuffix(leaf, "/two/_pod") {
			t.Skipf("no pids hierarchy leaf for the holder (%q)", cg)
		}
		stray := exec.Command("sleep", "300")
		if err := stray.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- stray.Wait() }()
		defer stray.Process.Kill()
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(stray.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		syscall.Kill(holder, syscall.SIGKILL)
		// Dead once it is a zombie (runnerd, its parent, reaps it when
		// it ends the pod) or gone.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", holder))
			if i := strings.LastIndexByte(string(b), ')'); err != nil || (i > 0 && b[i+2] == 'Z') {
				break
			}
		}
		if got := a.run("two", "id", "-u"); got != "0" {
			t.Errorf("pod two made again: id -u %q", got)
		}
		select {
		case err := <-done:
			t.Logf("the unrecorded process in _pod ended: %v", err)
		case <-time.After(5 * time.Second):
			t.Errorf("a process left in two's _pod leaf still runs after the pod was made again")
		}
	})
	run("park, resume, kill -9", func(t *testing.T) {
		a.must("POST", "/v1/sandboxes/one/suspend", nil, 200, nil)
		a.must("POST", "/v1/sandboxes/one/resume", nil, 200, nil)
		if got := a.run("one", "sh", "-c", podDebCheck); got != "install ok installed\ninstalled\nconfigured" {
			t.Errorf("the package after park and resume: %q", got)
		}
		live := a.spawn("one", wire.CreateSession{Argv: []string{"sh", "-c", "sleep 2; echo survived"}})
		p.kill(syscall.SIGKILL)
		a2, _ := startRunnerdProc(t0, lab, state, netState, "--isolate", "pod", "--bind", shared+":/opt/operator")
		a2.t = t
		if got := a2.run("one", "sh", "-c", podDebCheck); got != "install ok installed\ninstalled\nconfigured" {
			t.Errorf("the package after runnerd kill -9: %q", got)
		}
		if s := a2.waitEnded("one", live.ID); s.Exit == nil || s.Exit.Code != 0 {
			t.Errorf("session across the kill -9: %+v", s)
		}
		*a = *a2
	})
	run("destroy leaves nothing", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(state, "pods", "one"))
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		fmt.Sscanf(string(b), "%d", &pid)
		a.must("DELETE", "/v1/sandboxes/one", nil, 204, nil)
		if err := syscall.Kill(pid, 0); err == nil {
			deadline := time.Now().Add(5 * time.Second)
			for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if syscall.Kill(pid, 0) == nil {
				t.Errorf("holder %d still runs after destroy", pid)
			}
		}
		for _, p := range []string{filepath.Join(state, "pods", "one"), one.HostWorkspace} {
			if _, err := os.Lstat(p); !os.IsNotExist(err) {
				t.Errorf("%s after destroy: %v", p, err)
			}
		}
		if got := a.run("two", "id", "-u"); got != "0" {
			t.Errorf("pod two after one's destroy: id -u %q", got)
		}
	})
}

// podDebCheck prints what of the test package a pod has: dpkg's status,
// its file, its postinst's edit of /etc.
const podDebCheck = `dpkg-query -W -f='${Status}\n' podtest; cat /usr/share/podtest/hello; cat /etc/podtest.conf`

// buildPodDeb builds a tiny .deb with dpkg-deb: a file under /usr/share
// and a postinst that writes /etc, as postinsts do.
func buildPodDeb(t *testing.T) []byte {
	t.Helper()
	for _, tool := range []string{"dpkg-deb", "apt-get"} {
		if _, err := exec.LookPath(tool); err != nil {
			testcap.Skip(t, tool, "the pod test installs a .deb (a Debian host has dpkg and apt)")
		}
	}
	dir := t.TempDir()
	files := map[string]string{
		"DEBIAN/control":          "Package: podtest\nVersion: 1.0\nArchitecture: all\nMaintainer: runner tests <t@example.invalid>\nDescription: a package a pod installs\n",
		"DEBIAN/postinst":         "#!/bin/sh\nset -e\n[ \"$1\" = configure ] && echo configured > /etc/podtest.conf\nexit 0\n",
		"usr/share/podtest/hello": "installed\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, "pkg", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if name == "DEBIAN/postinst" {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	deb := filepath.Join(dir, "podtest.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", filepath.Join(dir, "pkg"), deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	b, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPodDiskBudget: a pod's writable root (what root installs) is on its
// volume with its workspace: a write past disk_bytes to /usr/local fails
// inside while another pod's exec answers, and a workspace file counts
// in the same budget.
func TestPodDiskBudget(t *testing.T) {
	state := passableTempDir(t)
	t.Cleanup(func() { killPods(t, state) })
	a, _ := startPooled(t, state, storage.Btrfs, "--isolate", "pod")
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "full", Limits: &wire.Limits{DiskBytes: 32 * mib}}, 200, nil)
	if sb := a.createSandbox("other"); !sb.Pod {
		t.Fatalf("other is not a pod: %+v", sb)
	}
	wantWriteRefused(t, a, "full", "/usr/local/big", 48*mib)
	bAnswers(t, a, "other", "full's root at its budget")
	wantExit0(t, a, "full", "rm /usr/local/big")
	wantExit0(t, a, "full", "head -c 20000000 /dev/zero > /workspace/w")
	wantWriteRefused(t, a, "full", "/usr/local/big", 16*mib)
	got := a.getSandbox("full")
	if got.Usage == nil || got.Usage.DiskBytes == nil || *got.Usage.DiskBytes < 24*mib {
		t.Fatalf("GET full: usage %+v, want the workspace and the root counted together", got.Usage)
	}
}

// TestPodBindConfig: an operator's bind is refused at start, before
// anything is made, when it is malformed, names a target the pod owns,
// a source that does not exist, or comes without pods.
func TestPodBindConfig(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "--isolate pod needs root")
	}
	for _, s := range []string{"/a", "/a:/b:rx", "a:b:c:d"} {
		if _, err := daemon.ParseBind(s); err == nil {
			t.Errorf("ParseBind(%q): no error", s)
		}
	}
	if b, err := daemon.ParseBind("/srv/x:/opt/x:rw"); err != nil || !b.Writable || b.Source != "/srv/x" || b.Target != "/opt/x" {
		t.Errorf("ParseBind rw: %+v %v", b, err)
	}
	src := t.TempDir()
	for _, c := range []struct {
		isolate, bind, want string
	}{
		{daemon.IsolatePod, src + ":/workspace/x", "in the pod's own /workspace"},
		{daemon.IsolatePod, src + ":relative", "not an absolute, clean path"},
		{daemon.IsolatePod, "/no/such/dir:/opt/x", "no such file or directory"},
		{daemon.IsolateAll, src + ":/opt/x", "--bind applies to pods"},
	} {
		b, err := daemon.ParseBind(c.bind)
		if err != nil {
			t.Fatal(err)
		}
		state := t.TempDir()
		cfg := daemon.Config{StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff, Isolate: c.isolate, PodBinds: []pod.Bind{b}}
		if err := daemon.Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--isolate %s --bind %s: %v, want %q", c.isolate, c.bind, err, c.want)
		}
		if entries, _ := os.ReadDir(state); len(entries) != 0 {
			t.Errorf("a refused configuration left %d entries in its state directory", len(entries))
		}
	}
}
