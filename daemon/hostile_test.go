package daemon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// The hostile-command suite: from inside a sandbox created with no options
// on a runnerd with its default isolation, testdata/attack tries each escape
// through the API, as a command would, and must fail with the expected
// errno. runnerd is the real binary, as root, with containment in a
// netlab.Lab, so no real host network is touched.

// parentPID returns the PPid of pid.
func parentPID(t *testing.T, pid int) int {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no PPid in /proc/%d/status", pid)
	return 0
}

func TestHostileCommand(t *testing.T) {
	lab := netlab.New(t)
	attack := buildAttack(t)
	state, netState := passableTempDir(t), netStateDir(t)
	// --isolate all: the attacks below are uid isolation's (a uid of the
	// sandbox's own, host paths it sees but cannot open, its user's name);
	// a pod's own (root inside, none of the host's files or processes)
	// are TestPodSandbox's.
	a, _ := startRunnerdProc(t, lab, state, netState, "--isolate", "all")
	run := a.subtests(t)

	deny := &wire.Network{Allow: []string{}}
	for _, port := range []int{7323, 8080} {
		hostService(t, lab, port)
	}
	// A service on runnerd's own loopback (the real host's, where the
	// test runs): a sandbox on the host network would reach it.
	loop, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Close()
	go func() {
		for {
			c, err := loop.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var hostile, victim wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "hostile"}, 200, &hostile)
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "victim"}, 200, &victim)
	for _, sb := range []wire.Sandbox{hostile, victim} {
		if !sb.Isolated || sb.UID == nil || sb.GID == nil || *sb.UID == 0 {
			t.Fatalf("sandbox %s created with no options: isolated %v uid %v gid %v, want isolated with a uid of its own", sb.Name, sb.Isolated, sb.UID, sb.GID)
		}
		if sb.Network == nil || !slices.Equal(sb.Network.Allow, []string{"*", "0.0.0.0/0"}) {
			t.Fatalf("sandbox %s created with no options: network %+v, want its own with open egress [* 0.0.0.0/0]", sb.Name, sb.Network)
		}
	}
	if *hostile.UID == *victim.UID {
		t.Fatalf("two sandboxes share uid %d", *hostile.UID)
	}
	uid := *hostile.UID

	// The victim: a secret in its workspace and a running command.
	a.run("victim", "sh", "-c", "echo secret > secret; for d in /var/tmp /dev/shm; do echo secret > $d/victim-secret; chmod 644 $d/victim-secret; done")
	victimCmd := a.spawn("victim", wire.CreateSession{ID: "victim-sleep", Argv: []string{"sleep", "600"}})
	// The hostile sandbox's own running command, whose shim it attacks,
	// and a second one of its own, to show the ptrace refusal is the uid
	// check and not Yama (this kernel has none, or it is 0-3).
	own := a.spawn("hostile", wire.CreateSession{ID: "own-sleep", Argv: []string{"sleep", "600"}})
	shimPID := parentPID(t, own.PID)
	var listen wire.Listen
	raw, err := os.ReadFile(filepath.Join(state, wire.ListenFile))
	if err != nil || json.Unmarshal(raw, &listen) != nil || listen.PID == 0 {
		t.Fatalf("read %s: %q, %v", wire.ListenFile, raw, err)
	}
	ownDir := sessionDirOf(t, state, own.ID)
	victimDir := sessionDirOf(t, state, victimCmd.ID)
	nsFiles := netnsFiles(t, netState)
	if len(nsFiles) != 2 {
		t.Fatalf("netns files %v, want one per sandbox", nsFiles)
	}
	var info wire.Info
	a.must("GET", "/v1/info", nil, 200, &info)
	yama, _ := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	t.Logf("runnerd pid %d, hostile shim pid %d, victim command pid %d, yama ptrace_scope %q", listen.PID, shimPID, victimCmd.PID, strings.TrimSpace(string(yama)))

	run("identity", func(t *testing.T) {
		if got := a.run("hostile", attack, "status"); got != isolatedStatus(uid) {
			t.Errorf("status:\n got %s\nwant %s", got, isolatedStatus(uid))
		}
		if u, g, mode := ownerOf(t, hostile.Workspace); u != uid || g != uid || mode != os.ModeDir|0o700 {
			t.Errorf("workspace %s: %d:%d %v, want %d:%d drwx------", hostile.Workspace, u, g, mode, uid, uid)
		}
	})

	cases := []struct {
		name string
		argv []string
		want string
	}{
		{"setns through /proc/1/ns/net", []string{"setns", "/proc/1/ns/net"}, "open:EACCES"},
		// runnerd's own namespace is the host's (pid 1 may live in
		// another, as in this CI's VM, where even root cannot open it).
		{"setns through runnerd's /proc/PID/ns/net", []string{"setns", fmt.Sprintf("/proc/%d/ns/net", listen.PID)}, "open:EACCES"},
		{"setns through the netns bind mount", []string{"setns", filepath.Join(netState, "netns", nsFiles[0])}, "open:EACCES"},
		// Reachable or not, a namespace needs CAP_SYS_ADMIN to enter.
		{"setns without capabilities", []string{"setns", "/proc/self/ns/net"}, "setns:EPERM"},
		{"edit the inet runner table", []string{"nft", info.NetworkTable}, "runner-visible=false list:EPERM del:EPERM add:EPERM"},
		{"change routes", []string{"route"}, "route:EPERM"},
		{"change links", []string{"link"}, "linkset:EPERM"},
		{"connect to the unix socket", []string{"unix", filepath.Join(state, "runnerd.sock")}, "connect:EACCES"},
		{"read the token", []string{"read", filepath.Join(state, "token")}, "open:EACCES"},
		{"read the registry", []string{"read", filepath.Join(state, "registry.db")}, "open:EACCES"},
		{"list the session directories", []string{"ls", filepath.Join(state, "s")}, "readdir:EACCES"},
		{"read its own spec.json", []string{"read", filepath.Join(ownDir, "spec.json")}, "open:EACCES"},
		{"read another sandbox's journal", []string{"ls", filepath.Join(victimDir, "journal")}, "readdir:EACCES"},
		{"list the workspaces", []string{"ls", filepath.Join(state, "sandboxes")}, "readdir:EACCES"},
		{"list another sandbox's workspace", []string{"ls", victim.Workspace}, "readdir:EACCES"},
		{"read another sandbox's workspace", []string{"read", filepath.Join(victim.Workspace, "secret")}, "open:EACCES"},
		{"write another sandbox's workspace", []string{"write", filepath.Join(victim.Workspace, "planted")}, "open:EACCES"},
		{"ptrace runnerd", []string{"ptrace", strconv.Itoa(listen.PID)}, "ptrace:EPERM"},
		{"ptrace its shim", []string{"ptrace", strconv.Itoa(shimPID)}, "ptrace:EPERM"},
		{"ptrace another sandbox's command", []string{"ptrace", strconv.Itoa(victimCmd.PID)}, "ptrace:EPERM"},
		{"kill -9 runnerd", []string{"kill", strconv.Itoa(listen.PID)}, "kill:EPERM"},
		{"kill -9 its shim", []string{"kill", strconv.Itoa(shimPID)}, "kill:EPERM"},
		{"kill -9 another sandbox's command", []string{"kill", strconv.Itoa(victimCmd.PID)}, "kill:EPERM"},
		{"mount", []string{"mount", hostile.Workspace}, "mount:EPERM"},
		// Its /var/tmp and /dev/shm are its own (privatetmp.go); /tmp too,
		// but not here: the test's state directory lies under /tmp, which
		// runnerd then leaves shared (TestPrivateTmpTargets).
		{"read another sandbox's /var/tmp", []string{"read", "/var/tmp/victim-secret"}, "open:ENOENT"},
		{"read another sandbox's /dev/shm", []string{"read", "/dev/shm/victim-secret"}, "open:ENOENT"},
		// Its loopback is its own: runnerd's (the host's) is not there.
		{"reach the host's loopback service", []string{"dial", loop.Addr().String()}, "connect:ECONNREFUSED"},
		// Open egress reaches the lab's host A, never the host: its
		// gateway and uplink refuse (netpolicy's input rejects).
		{"reach the outside", []string{"dial", netlab.A.String() + ":80"}, "ok"},
	}
	for _, ip := range hostAddrs(t, lab) {
		for _, port := range []int{7323, 8080} {
			addr := netip.AddrPortFrom(ip, uint16(port)).String()
			cases = append(cases, struct {
				name string
				argv []string
				want string
			}{"reach the host service " + addr, []string{"dial", addr}, "connect:ECONNREFUSED"})
		}
	}
	for _, c := range cases {
		run(c.name, func(t *testing.T) {
			if got := a.run("hostile", append([]string{attack}, c.argv...)...); got != c.want {
				t.Errorf("attack %v: got %q, want %q", c.argv, got, c.want)
			}
		})
	}
	run("setns through a reachable netns bind mount", func(t *testing.T) {
		// Were netpolicy's state directory passable, entering still
		// needs a capability the command does not have.
		for _, d := range []string{netState, filepath.Join(netState, "netns")} {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatal(err)
			}
			defer os.Chmod(d, 0o700)
		}
		argv := []string{attack, "setns", filepath.Join(netState, "netns", nsFiles[0])}
		if got := a.run("hostile", argv...); got != "setns:EPERM" {
			t.Errorf("attack %v: got %q, want setns:EPERM", argv[1:], got)
		}
	})
	run("setuid escalation", func(t *testing.T) {
		if got := a.run("hostile", setuidID, "-u"); got != strconv.Itoa(int(uid)) {
			t.Errorf("setuid-root id -u: got %q, want %d", got, uid)
		}
		// su is setuid root on this host: it gains nothing either.
		res := a.exec("hostile", wire.Exec{Argv: []string{"su", "-c", "id -u"}, TimeoutMS: 10000})
		if res.Exit.Code == 0 || strings.TrimSpace(string(res.Stdout)) == "0" {
			t.Errorf("su -c 'id -u': exit %+v stdout %q, want a failure", res.Exit, res.Stdout)
		}
	})
	run("the victim is untouched", func(t *testing.T) {
		if got := a.run("victim", "cat", "secret"); got != "secret" {
			t.Errorf("victim's secret: %q", got)
		}
		if _, err := os.Stat(filepath.Join(victim.Workspace, "planted")); !os.IsNotExist(err) {
			t.Errorf("planted file in the victim's workspace: %v", err)
		}
		var ss wire.Session
		a.must("GET", "/v1/sandboxes/victim/sessions/"+victimCmd.ID, nil, 200, &ss)
		if ss.State != wire.SessionRunning {
			t.Errorf("victim's command: state %q, want running", ss.State)
		}
		if err := syscall.Kill(listen.PID, 0); err != nil {
			t.Errorf("runnerd: %v", err)
		}
	})

	run("hostname is the sandbox's name", func(t *testing.T) {
		host, _ := os.Hostname()
		if got := a.run("hostile", "cat", "/proc/sys/kernel/hostname"); got != "hostile" {
			t.Errorf("hostname inside: %q, want hostile (the host's is %q)", got, host)
		}
	})
	run("its user has a name", func(t *testing.T) {
		// The host's user database has no entry for the sandbox's uid: a
		// read-only copy with one (passwdfiles.go) is bound over it.
		want := fmt.Sprintf("sandbox sandbox %d %s root", uid, hostile.Workspace)
		if got := a.run("hostile", "sh", "-c", `echo $(id -un) $(id -gn) $(getent passwd sandbox | cut -d: -f3) ~sandbox $(id -un 0)`); got != want {
			t.Errorf("inside: %q, want %q", got, want)
		}
		res := a.exec("hostile", wire.Exec{Argv: []string{"sh", "-c", "echo x >> /etc/passwd"}, TimeoutMS: 10000})
		if res.Exit.Code == 0 {
			t.Errorf("write to /etc/passwd: exit %+v, want a failure", res.Exit)
		}
		if b, err := os.ReadFile("/etc/passwd"); err != nil || bytes.Contains(b, []byte(fmt.Sprintf(":%d:", uid))) {
			t.Errorf("the host's /etc/passwd names the sandbox's uid %d (%v)", uid, err)
		}
	})
	run("private tmp is gone after destroy", func(t *testing.T) {
		var sb wire.Sandbox
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "shm"}, 200, &sb)
		// 1 MiB in /dev/shm: in its own directory, never the host's.
		a.run("shm", "sh", "-c", "head -c 1048576 /dev/zero > /dev/shm/left-behind")
		if _, err := os.Stat("/dev/shm/left-behind"); !os.IsNotExist(err) {
			t.Errorf("the host's /dev/shm/left-behind: %v, want absent", err)
		}
		dir := filepath.Join(state, "private", sb.Name+"-"+sb.Incarnation)
		if fi, err := os.Stat(filepath.Join(dir, "shm", "left-behind")); err != nil || fi.Size() != 1<<20 {
			t.Fatalf("the sandbox's /dev/shm file in %s: %v, %v; want 1 MiB", dir, fi, err)
		}
		a.must("DELETE", "/v1/sandboxes/shm", nil, 204, nil)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("private tmp %s after destroy: %v, want gone", dir, err)
		}
	})
	run("ping an allowed host", func(t *testing.T) {
		// ICMP echo without CAP_NET_RAW: ping_group_range in its netns.
		if _, err := exec.LookPath("ping"); err != nil {
			testcap.Skip(t, "ping", "iputils-ping is not installed")
		}
		res := a.exec("hostile", wire.Exec{Argv: []string{"ping", "-c", "1", "-W", "5", netlab.A.String()}, TimeoutMS: 20000})
		if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
			t.Errorf("ping %s: exit %+v stdout %q stderr %q, want exit 0", netlab.A, res.Exit, res.Stdout, res.Stderr)
		}
		a.putNetwork("hostile") // allow: []: the same ping is now refused
		res = a.exec("hostile", wire.Exec{Argv: []string{"ping", "-c", "1", "-W", "2", netlab.A.String()}, TimeoutMS: 20000})
		if res.Exit.Code == 0 {
			t.Errorf("ping %s under allow []: exit %+v, want a failure", netlab.A, res.Exit)
		}
	})

	run("root refused", func(t *testing.T) {
		for _, req := range []wire.CreateSandbox{{Name: "rooted", User: "root"}, {Name: "rooted", User: "root", Network: deny}} {
			r := a.do("POST", "/v1/sandboxes", req)
			a.wantError(r, http.StatusBadRequest, wire.CodeInvalid)
			if d := r.errBody(t).Detail; !strings.Contains(d, "omit user") {
				t.Errorf("detail %q does not say how to get a contained sandbox", d)
			}
			a.wantError(a.do("GET", "/v1/sandboxes/rooted", nil), http.StatusNotFound, wire.CodeNotFound)
		}
		// Naming an unprivileged user: kept, and isolated too.
		var named wire.Sandbox
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "named", User: "nobody", Network: deny}, 200, &named)
		if !named.Isolated || named.UID != nil {
			t.Errorf("contained sandbox naming nobody: isolated %v uid %v, want isolated, no uid of its own", named.Isolated, named.UID)
		}
		if got := a.run("named", attack, "status"); !strings.HasPrefix(got, "uid=65534 euid=65534 ") || !strings.HasSuffix(got, "CapBnd="+keptBounding+" CapAmb=0000000000000000 NoNewPrivs=1") {
			t.Errorf("status as nobody: %s", got)
		}
	})
}
