package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// passableTempDir is a t.TempDir whose parent another uid may pass
// through (0711): a state directory whose isolated sandboxes' commands,
// running as their own uids, can reach their workspaces. t.TempDir's
// parent is 0700.
func passableTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(filepath.Dir(d), 0o711); err != nil {
		t.Fatal(err)
	}
	return d
}

var (
	attackOnce sync.Once
	attackBin  string // testdata/attack, static, next to runnerd (0755)
	setuidID   string // a copy of /usr/bin/id, owned by root, mode 04755
	attackErr  error
)

// buildAttack builds testdata/attack once, static, where a sandbox's uid
// can run it, and places a setuid-root copy of id beside it.
func buildAttack(t *testing.T) string {
	t.Helper()
	attackOnce.Do(func() {
		dir := filepath.Dir(runnerdBin)
		attackBin = filepath.Join(dir, "attack")
		cmd := exec.Command("go", "build", "-o", attackBin, "./testdata/attack")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			attackErr = fmt.Errorf("build attack: %v\n%s", err, out)
			return
		}
		setuidID = filepath.Join(dir, "id-setuid")
		raw, err := os.ReadFile("/usr/bin/id")
		if err == nil {
			err = os.WriteFile(setuidID, raw, 0o755)
		}
		if err == nil {
			err = os.Chown(setuidID, 0, 0)
		}
		if err == nil {
			err = os.Chmod(setuidID, 0o755|os.ModeSetuid)
		}
		attackErr = err
	})
	if attackErr != nil {
		t.Fatal(attackErr)
	}
	// The escalation tests mean something only if the copy escalates for
	// whoever runs it without no_new_privs.
	if fi, err := os.Stat(setuidID); err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("%s is not setuid root: %v", setuidID, err)
	}
	return attackBin
}

// testIdentityRange is a small range of this test process's own, so that
// runnerds of concurrent test runs on the host never hand out the same
// uid: first is 0x60100000 + (pid mod 4096) * 64, below the slots runnerd
// chooses by default (0x70000000 up), since a default runnerd of a
// concurrent test takes a pod slot of 16.7 M ids there (with the ranges
// inside it: "identity range ... overlaps ... claimed by another runnerd").
func testIdentityRange(n uint32) (first, last uint32) {
	first = 0x60100000 + uint32(os.Getpid()%4096)*64
	return first, first + n - 1
}

// startRunnerdProc runs the runnerd binary on state with args (plus a
// unix socket) and returns an api on it and the process. runnerd makes
// its own token file (STATE/token), which the api reads. lab, when not nil, enables containment in it. Cleanup
// destroys every sandbox unless the process was stopped, then kills it.
func startRunnerdProc(t *testing.T, lab *netlab.Lab, state, netState string, args ...string) (*api, *proc) {
	t.Helper()
	sock := filepath.Join(state, "runnerd.sock")
	args = append([]string{"--state", state, "--listen", "none", "--socket", sock, "--cgroup-root", testCgroupRoot(t)}, args...)
	if lab != nil {
		args = append(args, lab.RunnerdArgs(netState)...)
	} else {
		args = append(args, "--netpolicy", "off")
	}
	cmd := exec.Command(runnerdBin, args...)
	p := startLogged(t, cmd)
	hc := unixHTTP(sock)
	a := &api{t: t, base: "http://runnerd", hc: hc, state: state}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			a.t = t
			a.destroyAll()
		}
		p.kill(syscall.SIGTERM)
	})
	a.waitUp(t, p)
	tok, err := os.ReadFile(filepath.Join(state, "token"))
	if err != nil {
		t.Fatal(err)
	}
	a.token = strings.TrimSpace(string(tok))
	return a, p
}

// run execs argv in sandbox and returns its stdout, trimmed; a command
// that does not exit 0 fails the test.
func (a *api) run(sandbox string, argv ...string) string {
	a.t.Helper()
	res := a.exec(sandbox, wire.Exec{Argv: argv, TimeoutMS: 20000})
	if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
		a.t.Fatalf("sandbox %s: %v: exit %+v, stdout %q, stderr %q", sandbox, argv, res.Exit, res.Stdout, res.Stderr)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// isolatedStatus is what `attack status` prints for a command running as
// uid (= gid) with no capabilities and no_new_privs (its bounding set
// keeps CAP_NET_RAW alone, which no_new_privs keeps it from holding:
// shim/exec.go, step 5).
func isolatedStatus(uid uint32) string {
	const zero = "0000000000000000"
	return fmt.Sprintf("uid=%d euid=%d gid=%d Groups= CapInh=%s CapPrm=%s CapEff=%s CapBnd=%s CapAmb=%s NoNewPrivs=1", uid, uid, uid, zero, zero, zero, keptBounding, zero)
}

// keptBounding is CapBnd of an isolated command: CAP_NET_RAW only.
const keptBounding = "0000000000002000"

// ownerOf returns the uid, gid and mode of path.
func ownerOf(t *testing.T, path string) (uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

// TestIsolateAll: under --isolate all every sandbox is isolated: one that
// names no user gets an identity of its own (shown in its body, owning its
// workspace 0700, the uid its commands run as, with no capabilities and
// no_new_privs); one naming an unprivileged user keeps it, isolated; one
// naming root is refused with a message that says how to get a contained
// sandbox.
func TestIsolateAll(t *testing.T) {
	attack := buildAttack(t)
	first, last := testIdentityRange(4)
	a := startDaemonCfg(t, daemon.Config{StateDir: passableTempDir(t), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		Isolate: daemon.IsolateAll, IdentityFirst: first, IdentityLast: last})

	sb := a.createSandbox("own")
	if !sb.Isolated || sb.UID == nil || sb.GID == nil || *sb.UID != first || *sb.GID != first {
		t.Fatalf("sandbox body: isolated %v uid %v gid %v, want isolated uid=gid=%d", sb.Isolated, sb.UID, sb.GID, first)
	}
	if uid, gid, mode := ownerOf(t, sb.Workspace); uid != first || gid != first || mode != os.ModeDir|0o700 {
		t.Errorf("workspace: owner %d:%d mode %v, want %d:%d drwx------", uid, gid, mode, first, first)
	}
	if got := a.run("own", attack, "status"); got != isolatedStatus(first) {
		t.Errorf("status in the sandbox:\n got %s\nwant %s", got, isolatedStatus(first))
	}
	// A session (not only an exec) runs the same way, and a setuid-root
	// binary gives it nothing.
	if got := a.run("own", setuidID, "-u"); got != strconv.Itoa(int(first)) {
		t.Errorf("setuid-root id -u: got %q, want %d (no_new_privs ignores the setuid bit)", got, first)
	}
	var again wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "own"}, 200, &again)
	if again.UID == nil || *again.UID != first {
		t.Errorf("create again: uid %v, want the same %d", again.UID, first)
	}
	other := a.createSandbox("other")
	if other.UID == nil || *other.UID == first {
		t.Fatalf("second sandbox: uid %v, want one of its own", other.UID)
	}

	var named wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "named", User: "nobody"}, 200, &named)
	if !named.Isolated || named.UID != nil || named.User != "nobody" {
		t.Fatalf("named sandbox: isolated %v uid %v user %q, want isolated, no uid, user nobody", named.Isolated, named.UID, named.User)
	}
	const zero = "0000000000000000"
	want := fmt.Sprintf("uid=65534 euid=65534 gid=65534 Groups= CapInh=%s CapPrm=%s CapEff=%s CapBnd=%s CapAmb=%s NoNewPrivs=1", zero, zero, zero, keptBounding, zero)
	if got := a.run("named", attack, "status"); !strings.HasPrefix(got, "uid=65534 euid=65534 ") || !strings.Contains(got, "CapBnd="+keptBounding) || !strings.HasSuffix(got, "NoNewPrivs=1") {
		t.Errorf("status as nobody:\n got %s\nwant %s", got, want)
	}

	for _, u := range []string{"root"} {
		r := a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "rooted", User: u})
		a.wantError(r, http.StatusBadRequest, wire.CodeInvalid)
		if d := r.errBody(t).Detail; !strings.Contains(d, "omit user") || !strings.Contains(d, "unprivileged user") {
			t.Errorf("user %q refused with %q: does not say how to get a contained sandbox", u, d)
		}
	}
	a.wantError(a.do("GET", "/v1/sandboxes/rooted", nil), http.StatusNotFound, wire.CodeNotFound)
}

// TestIsolateNone: --isolate none (and its old name, contained) opts out:
// a sandbox created with no options runs as runnerd's user (root here),
// shows no identity and cannot be given a policy (root would undo it).
func TestIsolateNone(t *testing.T) {
	for _, mode := range []string{daemon.IsolateNone, daemon.IsolateContained} {
		t.Run(mode, func(t *testing.T) {
			a := startDaemonCfg(t, daemon.Config{StateDir: passableTempDir(t), Token: testToken, NetPolicy: daemon.NetPolicyOff, Isolate: mode})
			sb := a.createSandbox("plain")
			if sb.Isolated || sb.UID != nil || sb.Network != nil {
				t.Fatalf("sandbox under --isolate %s: isolated %v uid %v network %+v, want none of them", mode, sb.Isolated, sb.UID, sb.Network)
			}
			if got := a.run("plain", "id", "-u"); got != strconv.Itoa(os.Geteuid()) {
				t.Errorf("id -u: got %q, want runnerd's %d", got, os.Geteuid())
			}
		})
	}
	t.Run("policy on a root sandbox refused", func(t *testing.T) {
		lab := netlab.New(t)
		netState := netStateDir(t)
		a, _ := startRunnerdProc(t, lab, passableTempDir(t), netState, "--isolate", "none")
		var plain wire.Sandbox
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "plain"}, 200, &plain)
		if plain.Isolated || plain.UID != nil || plain.Network != nil {
			t.Fatalf("sandbox under --isolate none: isolated %v uid %v network %+v, want none of them", plain.Isolated, plain.UID, plain.Network)
		}
		r := a.do("PUT", "/v1/sandboxes/plain/network", wire.Network{Allow: []string{}})
		a.wantError(r, http.StatusBadRequest, wire.CodeInvalid)
		// Its creator omitted user already: the advice is to create it
		// with its policy (issue 25 item 5), not to omit user.
		if d := r.errBody(t).Detail; !strings.Contains(d, "(root)") || !strings.Contains(d, "create it with its policy") || strings.Contains(d, "omit user") {
			t.Errorf("detail %q does not say why and what to do", d)
		}
		a.must("GET", "/v1/sandboxes/plain", nil, 200, &plain)
		if plain.Network != nil {
			t.Errorf("refused PUT set network %+v", plain.Network)
		}
		// A sandbox created with a policy is still isolated.
		var contained wire.Sandbox
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "contained", Network: &wire.Network{Allow: []string{}}}, 200, &contained)
		if !contained.Isolated || contained.UID == nil {
			t.Errorf("contained sandbox under --isolate none: isolated %v uid %v, want isolated with a uid", contained.Isolated, contained.UID)
		}
	})
}

// TestIsolateDefault: a root runnerd told nothing makes every sandbox a
// pod where pods can be made (user namespaces on, built with cgo: root
// inside, its host ids the block's, the workspace at /workspace), else
// isolates it by uid (--isolate all); /v1/info names which. Told
// --isolate all, a sandbox with no options gets a uid of its own, and a
// state directory whose parents runnerd creates is reachable by that uid
// (they are made 0755, not 0700 as ~/.local/state was), so the command
// starts in its workspace.
func TestIsolateDefault(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "the default isolation applies to a root runnerd")
	}
	attack := buildAttack(t)
	t.Run("default", func(t *testing.T) {
		want := rootDefaultIsolation()
		state := filepath.Join(passableTempDir(t), "home", ".local", "state", "runnerd")
		a := startDaemonCfg(t, daemon.Config{StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff})
		var info wire.Info
		a.must("GET", "/v1/info", nil, 200, &info)
		if info.Isolation != want {
			t.Fatalf("info isolation %q, want %q", info.Isolation, want)
		}
		sb := a.createSandbox("plain")
		if !sb.Isolated || sb.UID == nil || *sb.UID == 0 || sb.Pod != (want == daemon.IsolatePod) {
			t.Fatalf("sandbox with no options: isolated %v uid %v pod %v, want isolated with ids of its own, pod %v", sb.Isolated, sb.UID, sb.Pod, want == daemon.IsolatePod)
		}
		if want != daemon.IsolatePod {
			return
		}
		if sb.Workspace != "/workspace" || sb.HostWorkspace != filepath.Join(state, "sandboxes", "plain") {
			t.Errorf("workspace %q host_workspace %q, want /workspace and %s", sb.Workspace, sb.HostWorkspace, filepath.Join(state, "sandboxes", "plain"))
		}
		if got := a.run("plain", "sh", "-c", "id -u; pwd"); got != "0\n/workspace" {
			t.Errorf("id -u; pwd: %q, want 0 and /workspace", got)
		}
		// Root inside is the block's first id outside.
		ss := a.spawn("plain", wire.CreateSession{ID: "sleep", Argv: []string{"sleep", "600"}})
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ss.PID))
		if err != nil {
			t.Fatal(err)
		}
		if w := fmt.Sprintf("\nUid:\t%d\t%d\t%d\t%d\n", *sb.UID, *sb.UID, *sb.UID, *sb.UID); !strings.Contains(string(status), w) {
			t.Errorf("the session's host status has no %q:\n%s", w, status)
		}
	})
	t.Run("all", func(t *testing.T) {
		first, last := testIdentityRange(2)
		state := filepath.Join(passableTempDir(t), "home", ".local", "state", "runnerd")
		a := startDaemonCfg(t, daemon.Config{StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff,
			Isolate: daemon.IsolateAll, IdentityFirst: first, IdentityLast: last})
		sb := a.createSandbox("plain")
		if !sb.Isolated || sb.UID == nil || *sb.UID != first || sb.Pod {
			t.Fatalf("sandbox with no options: isolated %v uid %v pod %v, want isolated uid %d, no pod", sb.Isolated, sb.UID, sb.Pod, first)
		}
		if got := a.run("plain", attack, "status"); got != isolatedStatus(first) {
			t.Errorf("status:\n got %s\nwant %s", got, isolatedStatus(first))
		}
		if got := a.run("plain", "pwd"); got != sb.Workspace {
			t.Errorf("pwd: %q, want its workspace %s", got, sb.Workspace)
		}
		for d := filepath.Dir(state); d != filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(state)))); d = filepath.Dir(d) {
			if _, _, mode := ownerOf(t, d); mode != os.ModeDir|0o755 {
				t.Errorf("%s: mode %v, want drwxr-xr-x (made by runnerd, holding nothing of its own)", d, mode)
			}
		}
	})
}

// TestDefaultStateDirRoot: as root with nothing in the environment the
// state goes to /var/lib/runnerd (root's home is 0700, a dead end for an
// isolated sandbox's uid), unless an older runnerd's registry is in
// ~/.local/state/runnerd, which is kept.
func TestDefaultStateDirRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "the root default is only taken as root")
	}
	home := t.TempDir()
	for _, k := range []string{"STATE_DIRECTORY", daemon.EnvState, "XDG_STATE_HOME"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("HOME", home)
	if got, err := daemon.DefaultStateDir(); err != nil || got != daemon.RootStateDir {
		t.Errorf("DefaultStateDir: %q, %v; want %s", got, err, daemon.RootStateDir)
	}
	legacy := filepath.Join(home, ".local", "state", "runnerd")
	if err := os.MkdirAll(legacy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(legacy, "registry.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := daemon.DefaultStateDir(); err != nil || got != legacy {
		t.Errorf("DefaultStateDir with an older runnerd's registry: %q, %v; want %s", got, err, legacy)
	}
}

// TestIdentityDurable: an identity survives kill -9 of runnerd and
// park/resume (same uid, its files still its own), a full range refuses a
// create, and destroy frees it: the registry shows it free and a new
// sandbox receives it.
func TestIdentityDurable(t *testing.T) {
	buildAttack(t)
	state := passableTempDir(t)
	first, _ := testIdentityRange(1)
	args := []string{"--isolate", "all", "--identity-range", fmt.Sprintf("%d-%d", first, first)}
	a, p := startRunnerdProc(t, nil, state, "", args...)
	sb := a.createSandbox("keep")
	if sb.UID == nil || *sb.UID != first {
		t.Fatalf("uid %v, want %d", sb.UID, first)
	}
	a.run("keep", "sh", "-c", "echo mine > file")
	ss := a.spawn("keep", wire.CreateSession{ID: "sleeper", Argv: []string{"sleep", "600"}})
	r := a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "full"})
	a.wantError(r, http.StatusServiceUnavailable, wire.CodeUnavailable)
	if d := r.errBody(t).Detail; !strings.Contains(d, "no free identity") {
		t.Errorf("create with the range used up: detail %q, want it to say no free identity", d)
	}

	p.kill(syscall.SIGKILL)
	a, p = startRunnerdProc(t, nil, state, "", args...)
	var got wire.Sandbox
	a.must("GET", "/v1/sandboxes/keep", nil, 200, &got)
	if got.UID == nil || *got.UID != first || !got.Isolated {
		t.Fatalf("after kill -9: uid %v isolated %v, want %d, isolated", got.UID, got.Isolated, first)
	}
	if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ss.PID)); err != nil || !strings.Contains(string(raw), fmt.Sprintf("\nUid:\t%d\t%d", first, first)) {
		t.Errorf("the session's command after kill -9 of runnerd: status %q, %v; want uid %d", raw, err, first)
	}
	a.must("POST", "/v1/sandboxes/keep/suspend", nil, 200, nil)
	a.must("POST", "/v1/sandboxes/keep/resume", nil, 200, &got)
	if got.UID == nil || *got.UID != first {
		t.Fatalf("after park/resume: uid %v, want %d", got.UID, first)
	}
	if out := a.run("keep", "sh", "-c", "id -u; cat file; echo more >> file"); out != fmt.Sprintf("%d\nmine", first) {
		t.Errorf("after park/resume: got %q, want uid %d and its file", out, first)
	}
	if uid, _, _ := ownerOf(t, filepath.Join(got.Workspace, "file")); uid != first {
		t.Errorf("file owner after resume: %d, want %d", uid, first)
	}

	a.must("DELETE", "/v1/sandboxes/keep", nil, 204, nil)
	next := a.createSandbox("next")
	if next.UID == nil || *next.UID != first {
		t.Fatalf("after destroy: new sandbox uid %v, want the freed %d", next.UID, first)
	}
	a.must("DELETE", "/v1/sandboxes/next", nil, 204, nil)
	p.kill(syscall.SIGTERM)
	reg, err := registry.Open(filepath.Join(state, "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	held, err := reg.Identities()
	if err != nil || len(held) != 0 {
		t.Errorf("identities held after destroying every sandbox: %v, %v; want none", held, err)
	}
}

// TestIsolationConfigRefused: runnerd refuses to start with an identity
// range holding an id Linux gives a meaning, a malformed --isolate, or
// --isolate all where it is not root (it could not give identities).
func TestIsolationConfigRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  daemon.Config
	}{
		{"range holds root", daemon.Config{IdentityFirst: 0, IdentityLast: 100}},
		{"range holds nobody", daemon.Config{IdentityFirst: 65000, IdentityLast: 66000}},
		{"range holds (uid_t)-1", daemon.Config{IdentityFirst: 1<<32 - 10, IdentityLast: 1<<32 - 1}},
		{"empty range", daemon.Config{IdentityFirst: 200, IdentityLast: 100}},
		{"unknown isolate", daemon.Config{Isolate: "some"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.StateDir, cfg.Token, cfg.NetPolicy, cfg.Listen, cfg.Socket = t.TempDir(), testToken, daemon.NetPolicyOff, "127.0.0.1:0", "none"
			if err := daemon.Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "config:") {
				t.Fatalf("Run: %v, want a config error", err)
			}
		})
	}
	for _, bad := range []string{"", "1-", "a-b", "5"} {
		if _, _, err := daemon.ParseIdentityRange(bad); err == nil {
			t.Errorf("ParseIdentityRange(%q) accepted", bad)
		}
	}
	if f, l, err := daemon.ParseIdentityRange("1879048192-1879113727"); err != nil || f != daemon.DefaultIdentityFirst || l != daemon.DefaultIdentityLast {
		t.Errorf("ParseIdentityRange of the default: %d-%d, %v", f, l, err)
	}

	// Not root: --isolate all is refused at start.
	state := t.TempDir()
	if err := os.Chown(state, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(state), 0o711); err != nil {
		t.Fatal(err)
	}
	// Bounded: a runnerd that wrongly starts serves until killed.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, runnerdBin, "--state", state, "--listen", "none", "--socket", filepath.Join(state, "s.sock"),
		"--netpolicy", "off", "--cgroups", "off", "--isolate", "all", "--warm-shims", "0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+testToken)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "--isolate all needs runnerd to run as root") {
		t.Errorf("runnerd --isolate all as nobody: %v, output %q; want exit 1 saying it needs root", err, out)
	}
}
