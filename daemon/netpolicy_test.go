package daemon_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// The network-policy tests run the real runnerd binary, with the flags an
// operator or the conformance harness passes, inside a netlab.Lab: a
// private world of namespaces this test creates. Commands in sandboxes are
// a probe program (testdata/probe) that talks only to the lab's
// addresses. runnerd's own namespace (the real host's) is never changed:
// TestMain compares its links and nftables tables before and after.

var (
	probeOnce sync.Once
	probeBin  string
	probeErr  error
)

// buildProbe builds testdata/probe once, next to runnerd.
func buildProbe(t *testing.T) string {
	t.Helper()
	probeOnce.Do(func() {
		probeBin = filepath.Join(filepath.Dir(runnerdBin), "probe")
		out, err := exec.Command("go", "build", "-o", probeBin, "./testdata/probe").CombinedOutput()
		if err != nil {
			probeErr = fmt.Errorf("build probe: %v\n%s", err, out)
		}
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeBin
}

// startNetRunnerd runs the runnerd binary with network containment in w.
// Cleanup destroys every sandbox, unless stop (SIGTERM, wait) was called,
// then kills the process.
func startNetRunnerd(t *testing.T, lab *netlab.Lab, state, netState string) (a *api, stop func()) {
	t.Helper()
	sock := filepath.Join(state, "runnerd.sock")
	// --isolate none: TestNetworkPolicy moves a host-network sandbox into
	// a namespace, and only under none does a sandbox created without a
	// policy use the host network (its contained sandboxes are isolated
	// all the same). The default's own network is TestHostileCommand's.
	cmd := exec.Command(runnerdBin, append([]string{"--state", state, "--listen", "none", "--socket", sock, "--cgroup-root", testCgroupRoot(t), "--isolate", "none"},
		lab.RunnerdArgs(netState)...)...)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+testToken)
	p := startLogged(t, cmd)
	stopped := false
	stop = func() { stopped = true; p.kill(syscall.SIGTERM) }
	t.Cleanup(func() {
		if !stopped {
			a.t = t
			a.destroyAll()
		}
		p.kill(syscall.SIGKILL)
	})
	hc := unixHTTP(sock)
	a = &api{t: t, base: "http://runnerd", hc: hc, token: testToken, state: state}
	a.waitUp(t, p)
	return a, stop
}

// probe runs the probe in sandbox and returns whether it succeeded and
// what it printed.
func (a *api) probe(sandbox string, args ...string) (bool, string) {
	a.t.Helper()
	// Never probe from the host network: the world's addresses are
	// routed nowhere there, and the test must send nothing outside it.
	var sb wire.Sandbox
	a.must("GET", "/v1/sandboxes/"+sandbox, nil, 200, &sb)
	if sb.Network == nil {
		a.t.Fatalf("refusing to probe from sandbox %s: it is on the host network", sandbox)
	}
	res := a.exec(sandbox, wire.Exec{Argv: append([]string{probeBin}, args...), TimeoutMS: 20000})
	out := strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
	return res.Exit.Reason == wire.ExitExited && res.Exit.Code == 0, out
}

func (a *api) wantReach(sandbox string, args ...string) {
	a.t.Helper()
	if ok, out := a.probe(sandbox, args...); !ok {
		a.t.Errorf("sandbox %s: probe %v: got failure (%s), want success", sandbox, args, out)
	}
}

func (a *api) wantNoReach(sandbox string, args ...string) {
	a.t.Helper()
	if ok, out := a.probe(sandbox, args...); ok {
		a.t.Errorf("sandbox %s: probe %v: got success (%s), want failure", sandbox, args, out)
	}
}

func (a *api) putNetwork(sandbox string, allow ...string) wire.Sandbox {
	a.t.Helper()
	var sb wire.Sandbox
	a.must("PUT", "/v1/sandboxes/"+sandbox+"/network", wire.Network{Allow: append([]string{}, allow...)}, 200, &sb)
	if sb.Network == nil || !slices.Equal(sb.Network.Allow, append([]string{}, allow...)) {
		a.t.Fatalf("PUT network %v: sandbox shows %+v", allow, sb.Network)
	}
	return sb
}

// rnLinks lists the sandbox veths (host ends) in the world's host ns.
func rnLinks(t *testing.T, lab *netlab.Lab) []string {
	t.Helper()
	var out []string
	for _, l := range lab.HostLinks(t) {
		// Every table's veth prefix starts with "r" (netpolicy.IfPrefix);
		// none of the lab's own links does.
		if strings.HasPrefix(l.Attrs().Name, "r") {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

func netnsFiles(t *testing.T, netState string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(netState, "netns"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestNetworkPolicy(t *testing.T) {
	w := netlab.New(t)
	buildProbe(t)
	state := passableTempDir(t) // contained sandboxes run as their own uid
	netState := t.TempDir()
	// Last cleanup to run: whatever a failed test left mounted goes, so
	// TempDir can be removed.
	t.Cleanup(func() { netlab.UnmountLeftovers(netState) })
	a, stop := startNetRunnerd(t, w, state, netState)

	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	if !slices.Contains(caps.Capabilities, wire.CapNetworkPolicy) {
		t.Fatalf("capabilities %v lack network_policy on a host that enforces it", caps.Capabilities)
	}
	A, B, C := netlab.A.String(), netlab.B.String(), netlab.C.String()
	// run runs a subtest with the api failing into it.
	t0 := t
	run := a.subtests(t0)

	// Created with allow: [] — contained before any command runs.
	var sb wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "deny", Network: &wire.Network{Allow: []string{}}}, 200, &sb)
	if sb.Network == nil || len(sb.Network.Allow) != 0 {
		t.Fatalf("created sandbox network %+v, want allow: []", sb.Network)
	}
	sb = wire.Sandbox{}
	a.must("GET", "/v1/sandboxes/deny", nil, 200, &sb)
	if sb.Network == nil || sb.Network.Allow == nil || len(sb.Network.Allow) != 0 {
		t.Fatalf("GET sandbox network %+v, want allow: []", sb.Network)
	}
	run("a command that exits at once", func(t *testing.T) {
		// The namespace check must not race a command that is gone before
		// runnerd looks at it: that is an exit, never a failed spawn.
		for i := range 20 {
			res := a.exec("deny", wire.Exec{Argv: []string{"sh", "-c", "exit 5"}})
			if res.Exit.Reason != "exited" || res.Exit.Code != 5 {
				t.Fatalf("run %d: exec of an instant exit 5 = %+v, want exited 5", i, res.Exit)
			}
		}
	})
	run("allow none", func(t *testing.T) {
		a.wantNoReach("deny", "get", A)
		a.wantNoReach("deny", "get", B)
		a.wantNoReach("deny", "dns", C, "allowed.test")
		a.wantNoReach("deny", "dns", "gw", "allowed.test")
		a.wantNoReach("deny", "getname", "allowed.test")
		// The same with bash, the way the conformance probe does it.
		res := a.exec("deny", wire.Exec{Argv: netlab.ProbeArgv(A)})
		if res.Exit.Code == 0 {
			t.Errorf("bash /dev/tcp to %s under allow: [] succeeded", A)
		}
	})
	run("allow one IP", func(t *testing.T) {
		a.putNetwork("deny", A)
		a.wantReach("deny", "get", A)
		a.wantNoReach("deny", "get", B)
		a.wantNoReach("deny", "dns", C, "allowed.test")
		res := a.exec("deny", wire.Exec{Argv: netlab.ProbeArgv(A)})
		if res.Exit.Code != 0 {
			t.Errorf("bash /dev/tcp to the allowed %s: exit %+v, stderr %q", A, res.Exit, res.Stderr)
		}
	})
	run("allow one name", func(t *testing.T) {
		a.putNetwork("deny", "allowed.test")
		// Ordinary programs resolve through /etc/resolv.conf, which inside
		// a contained sandbox names its gateway's resolver (shim
		// Spec.ResolvConf), and connect by name.
		res := a.exec("deny", wire.Exec{Argv: []string{"cat", "/etc/resolv.conf"}})
		if !strings.Contains(string(res.Stdout), "nameserver 10.98.0.") {
			t.Errorf("/etc/resolv.conf in the sandbox: got %q (exit %+v), want the gateway in %s as nameserver", res.Stdout, res.Exit, netlab.Pool)
		}
		res = a.exec("deny", wire.Exec{Argv: []string{"getent", "hosts", "other.test"}})
		if res.Exit.Code == 0 {
			t.Errorf("getent hosts other.test: got %q, want a failure (the resolver refuses it)", res.Stdout)
		}
		res = a.exec("deny", wire.Exec{Argv: []string{"getent", "hosts", "allowed.test"}})
		if f := strings.Fields(string(res.Stdout)); res.Exit.Code != 0 || len(f) != 2 || f[0] != A || f[1] != "allowed.test" {
			t.Errorf("getent hosts allowed.test: got %q, exit %+v, stderr %q; want %s allowed.test", res.Stdout, res.Exit, res.Stderr, A)
		}
		res = a.exec("deny", wire.Exec{Argv: netlab.ProbeArgv("allowed.test")})
		if res.Exit.Code != 0 {
			t.Errorf("bash /dev/tcp to allowed.test by name: exit %+v, stderr %q", res.Exit, res.Stderr)
		}
		a.wantNoReach("deny", "get", B)
		a.wantNoReach("deny", "dns", C, "allowed.test")
		a.wantNoReach("deny", "dns", "gw", "other.test")
		a.wantNoReach("deny", "getname", "other.test")
		a.wantReach("deny", "getname", "allowed.test")
		a.wantReach("deny", "get", A) // admitted by the resolver's answer
	})
	run("host network then policy", func(t *testing.T) {
		var sb wire.Sandbox
		// An unprivileged user: a policy is never added to a sandbox
		// whose commands run as root (TestIsolation).
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "hostnet", User: "nobody"}, 200, &sb)
		if sb.Network != nil {
			t.Fatalf("sandbox created without a policy shows %+v", sb.Network)
		}
		ss := a.spawn("hostnet", wire.CreateSession{ID: "sleeper", Argv: []string{"sleep", "60"}})
		r := a.do("PUT", "/v1/sandboxes/hostnet/network", wire.Network{Allow: []string{A}})
		a.wantError(r, http.StatusConflict, wire.CodeInvalid)
		if d := r.errBody(t).Detail; !strings.Contains(d, "terminate or suspend") {
			t.Errorf("409 detail %q does not say to terminate or suspend the sessions", d)
		}
		sb = wire.Sandbox{}
		a.must("GET", "/v1/sandboxes/hostnet", nil, 200, &sb)
		if sb.Network != nil {
			t.Fatalf("refused PUT changed the sandbox: network %+v", sb.Network)
		}
		a.must("POST", "/v1/sandboxes/hostnet/sessions/"+ss.ID+"/terminate", wire.Terminate{GraceMS: 100}, 200, nil)
		a.putNetwork("hostnet", A)
		a.wantReach("hostnet", "get", A)
		a.wantNoReach("hostnet", "get", B)
		// A session started now runs inside: a running one no longer blocks.
		a.spawn("hostnet", wire.CreateSession{ID: "inside", Argv: []string{"sleep", "60"}})
		a.putNetwork("hostnet")
		a.wantNoReach("hostnet", "get", A)
	})
	run("create conflicts", func(t *testing.T) {
		// A create asking for containment never gets a sandbox contained
		// less or differently.
		a.wantError(a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "deny", Network: &wire.Network{Allow: []string{}}}), http.StatusConflict, wire.CodeInvalid)
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "deny", Network: &wire.Network{Allow: []string{"allowed.test"}}}, 200, &sb)
		a.wantError(a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "n2", Network: &wire.Network{Allow: []string{"::1"}}}), 400, wire.CodeInvalid)
		a.wantError(a.do("PUT", "/v1/sandboxes/deny/network", `{"allow":["a.test:80"]}`), 400, wire.CodeInvalid)
		a.wantError(a.do("PUT", "/v1/sandboxes/deny/network", `{}`), 400, wire.CodeInvalid)
	})
	run("destroy tears down", func(t *testing.T) {
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "gone", Network: &wire.Network{Allow: []string{A}}}, 200, &sb)
		links, files := rnLinks(t, w), netnsFiles(t, netState)
		a.must("DELETE", "/v1/sandboxes/gone", nil, 204, nil)
		if got := rnLinks(t, w); len(got) != len(links)-1 {
			t.Errorf("veths after destroy: got %v, want one fewer than %v", got, links)
		}
		if got := netnsFiles(t, netState); len(got) != len(files)-1 {
			t.Errorf("netns files after destroy: got %v, want one fewer than %v", got, files)
		}
		// A new incarnation of the name starts from a fresh namespace.
		a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "gone", Network: &wire.Network{Allow: []string{}}}, 200, &sb)
		a.wantNoReach("gone", "get", A)
		a.must("DELETE", "/v1/sandboxes/gone", nil, 204, nil)
	})
	run("restart re-adopts", func(t *testing.T) {
		links, files := rnLinks(t, w), netnsFiles(t, netState)
		stop()
		// Rules keep enforcing while no runnerd runs; a new one converges.
		a2, _ := startNetRunnerd(t0, w, state, netState) // stopped by t0's cleanups
		a2.t = t
		defer func() { a2.t = t0 }()
		var sb wire.Sandbox
		a2.must("GET", "/v1/sandboxes/deny", nil, 200, &sb)
		if sb.Network == nil || !slices.Equal(sb.Network.Allow, []string{"allowed.test"}) {
			t.Fatalf("after restart: network %+v, want allow [allowed.test]", sb.Network)
		}
		a2.wantReach("deny", "getname", "allowed.test") // the resolver is back
		a2.wantNoReach("deny", "get", B)
		a2.wantNoReach("hostnet", "get", A)
		if got := rnLinks(t, w); !slices.Equal(got, links) {
			t.Errorf("veths after restart: got %v, want %v", got, links)
		}
		if got := netnsFiles(t, netState); !slices.Equal(got, files) {
			t.Errorf("netns files after restart: got %v, want %v", got, files)
		}
		a2.destroyAll()
		if got := rnLinks(t, w); len(got) != 0 {
			t.Errorf("veths after destroying every sandbox: %v", got)
		}
		if got := netnsFiles(t, netState); len(got) != 0 {
			t.Errorf("netns files after destroying every sandbox: %v", got)
		}
	})
}

// TestNetworkPolicyOff: with --netpolicy=off (what every other test here
// uses) a root runnerd neither advertises nor accepts policies.
func TestNetworkPolicyOff(t *testing.T) {
	a := startDaemon(t)
	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	if slices.Contains(caps.Capabilities, wire.CapNetworkPolicy) {
		t.Errorf("capabilities %v advertise network_policy with containment off", caps.Capabilities)
	}
}

// TestNetworkPolicyEscapeKilled proves the spawn check: a shim that
// ignores Spec.NetNS (a wrapper that deletes it from spec.json before the
// real shim reads it) starts the command outside the sandbox's namespace;
// runnerd notices, kills it, forgets the session and answers 503.
func TestNetworkPolicyEscapeKilled(t *testing.T) {
	lab := netlab.New(t)
	netState := netStateDir(t)
	lying := `for d; do :; done; sed -i 's/,"netns":"[^"]*"//' "$d/spec.json" && exec "$0" shim "$@"`
	a := startDaemonCfg(t, daemon.Config{
		StateDir: passableTempDir(t), Token: testToken,
		NetPolicyState: netState, NetPolicyPool: netlab.Pool, NetPolicyHostNetNS: lab.HostNetNS,
		DNSUpstream: []netip.AddrPort{netip.AddrPortFrom(netlab.C, 53)},
		ShimCommand: []string{"/bin/sh", "-c", lying, runnerdBin},
		Isolate:     daemon.IsolateNone, // "plain" on the host network
	})
	// The wrapper itself works: a host-network sandbox runs normally.
	a.createSandbox("plain")
	a.spawn("plain", wire.CreateSession{ID: "ok", Argv: []string{"true"}})

	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "boxed", Network: &wire.Network{Allow: []string{}}}, 200, nil)
	marker := "31.4159"
	r := a.do("POST", "/v1/sandboxes/boxed/sessions", wire.CreateSession{ID: "escape", Argv: []string{"sleep", marker}})
	a.wantError(r, http.StatusServiceUnavailable, wire.CodeUnavailable)
	if d := r.errBody(t).Detail; !strings.Contains(d, "not in the sandbox's network namespace") {
		t.Errorf("503 detail %q does not say the command escaped the namespace", d)
	}
	var list wire.SessionList
	a.must("GET", "/v1/sandboxes/boxed/sessions", nil, 200, &list)
	if len(list.Sessions) != 0 {
		t.Errorf("sessions after a refused spawn: %+v, want none", list.Sessions)
	}
	if pids := processesWithArg(marker); len(pids) != 0 {
		t.Errorf("the escaped command still runs: pids %v", pids)
	}
}

// processesWithArg lists the pids whose command line has arg.
func processesWithArg(arg string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(raw), "\x00"), arg) {
			out = append(out, pid)
		}
	}
	return out
}
