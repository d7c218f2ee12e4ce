package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
)

var cgroupRootSeq atomic.Int64

// testCgroupRoot returns a cgroup root (daemon.Config.CgroupRoot) of the
// test's own, and at cleanup removes it with every sandbox cgroup left
// under it (killing what they hold: only this test's commands).
func testCgroupRoot(t *testing.T) string {
	t.Helper()
	root := fmt.Sprintf("runner-test-%d-%d", os.Getpid(), cgroupRootSeq.Add(1))
	t.Cleanup(func() {
		dirs := cgroupRootDirs(root)
		if len(dirs) == 0 {
			return
		}
		m, err := cgroup.New(cgroup.Config{Root: root})
		if err != nil {
			t.Logf("remove test cgroups %s: %v", root, err)
			return
		}
		names, _ := m.List()
		for _, n := range names {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := m.Remove(ctx, n); err != nil {
				t.Errorf("remove test cgroup %s/%s: %v", root, n, err)
			}
			cancel()
		}
		for _, d := range cgroupRootDirs(root) {
			if err := os.Remove(d); err != nil {
				t.Errorf("remove test cgroup root: %v", err)
			}
		}
	})
	return root
}

// cgroupHierarchies maps each controller of this process's cgroups
// (/proc/self/cgroup) to its directory, "" for the v2 hierarchy.
func cgroupHierarchies() map[string]string {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			mnt := "/sys/fs/cgroup/unified"
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				mnt = "/sys/fs/cgroup"
			}
			out[""] = filepath.Join(mnt, parts[2])
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if !strings.HasPrefix(c, "name=") {
				out[c] = filepath.Join("/sys/fs/cgroup", c, parts[2])
			}
		}
	}
	return out
}

// cgroupRootDirs lists the directories of root that exist, deepest
// hierarchy order irrelevant (each is one rmdir).
func cgroupRootDirs(root string) []string {
	var dirs []string
	seen := map[string]bool{}
	for _, d := range cgroupHierarchies() {
		p := filepath.Join(d, root)
		real, err := filepath.EvalSymlinks(p)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		dirs = append(dirs, p)
	}
	return dirs
}

// needV1Cgroups skips, loudly, where the limits cannot be enforced (not
// root, or a host without the v1 controllers these tests read files of).
func needV1Cgroups(t *testing.T) {
	t.Helper()
	testcap.Root(t, "resource limits need root to write cgroups")
	h := cgroupHierarchies()
	for _, c := range []string{"memory", "pids", "cpu"} {
		if _, ok := h[c]; !ok {
			t.Skipf("SKIP: no cgroup v1 %s controller on this host (these tests read v1 files; the cgroup package tests v2)", c)
		}
	}
}

// hostHasLimits reports whether a default runnerd here advertises
// resource_limits: root and the v1 memory, pids and cpu controllers.
func hostHasLimits() bool {
	h := cgroupHierarchies()
	for _, c := range []string{"memory", "pids", "cpu"} {
		if _, ok := h[c]; !ok {
			return false
		}
	}
	return os.Geteuid() == 0
}

// sbCgroup is the directory of sandbox name's cgroup in controller's
// hierarchy under root.
func sbCgroup(root, controller, name string) string {
	return filepath.Join(cgroupHierarchies()[controller], root, name)
}

// readCgroup returns a cgroup file's trimmed content.
func readCgroup(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// limitsDaemon starts a daemon with cgroups and returns it with its root.
func limitsDaemon(t *testing.T) (*api, string) {
	t.Helper()
	needV1Cgroups(t)
	root := testCgroupRoot(t)
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, CgroupRoot: root})
	if !slices.Contains(a.capabilities(), wire.CapResourceLimits) {
		t.Fatalf("capabilities %v: no %s on a root host with the controllers", a.capabilities(), wire.CapResourceLimits)
	}
	return a, root
}

func (a *api) capabilities() []string {
	a.t.Helper()
	var c wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &c)
	return c.Capabilities
}

func (a *api) createLimited(name string, l wire.Limits) wire.Sandbox {
	a.t.Helper()
	var sb wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: name, Limits: &l}, 200, &sb)
	return sb
}

// streamLen is the length of a session's stdout now.
func (a *api) streamLen(sandbox, id string) int {
	a.t.Helper()
	r := a.do("GET", "/v1/sandboxes/"+sandbox+"/sessions/"+id+"/streams/stdout", nil)
	if r.status != 200 {
		a.t.Fatalf("read stdout: %d %s", r.status, r.body)
	}
	return len(r.body)
}

// TestLimitsOOMKillIsHonest: a memory hog over its sandbox's limit is
// killed by the kernel, and its exit record says so (signaled, 9, 137,
// oom_killed) while a session of another sandbox keeps streaming.
func TestLimitsOOMKillIsHonest(t *testing.T) {
	a, _ := limitsDaemon(t)
	a.createLimited("hog", wire.Limits{MemoryBytes: smallMemory})
	a.createSandbox("other")
	ticker := a.spawn("other", wire.CreateSession{Argv: []string{"sh", "-c", "while :; do echo tick; sleep 0.02; done"}})
	// tail keeps every byte of a "line" that never ends: it grows until
	// the kernel kills it.
	hog := a.spawn("hog", wire.CreateSession{Argv: []string{"tail", "/dev/zero"}})
	got := a.waitEndedWithin("hog", hog.ID, 60*time.Second)
	if e := got.Exit; e == nil || e.Reason != wire.ExitSignaled || e.Signal != 9 || e.Code != 137 || !e.OOMKilled {
		t.Fatalf("hog's exit: got %+v, want signaled, signal 9, code 137, oom_killed", got.Exit)
	}
	var sb wire.Sandbox
	a.must("GET", "/v1/sandboxes/hog", nil, 200, &sb)
	if sb.Usage == nil || sb.Usage.OOMKills < 1 || sb.Usage.MemoryPeakBytes < smallMemory/2 {
		t.Fatalf("hog's usage: got %+v, want oom_kills >= 1 and a peak near the limit", sb.Usage)
	}
	if sb.Limits == nil || sb.Limits.MemoryBytes != smallMemory {
		t.Fatalf("hog's limits: got %+v", sb.Limits)
	}
	// /metrics has the same, per sandbox.
	m := string(a.do("GET", "/metrics", nil).body)
	for _, want := range []string{`runnerd_sandbox_oom_kills_total{sandbox="hog"} 1` + "\n", `runnerd_sandbox_pids{sandbox="other"} `, "runnerd_sandbox_usage_omitted 0\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, m)
		}
	}
	// The other sandbox never noticed.
	before := a.streamLen("other", ticker.ID)
	deadline := time.Now().Add(10 * time.Second)
	for a.streamLen("other", ticker.ID) <= before {
		if time.Now().After(deadline) {
			t.Fatal("the other sandbox's session stopped streaming")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var ts wire.Session
	a.must("GET", "/v1/sandboxes/other/sessions/"+ticker.ID, nil, 200, &ts)
	if ts.State != wire.SessionRunning {
		t.Fatalf("other's session: got %s, want running", ts.State)
	}
	// A plain SIGKILL of a limited session is not an OOM kill.
	sleeper := a.spawn("hog", wire.CreateSession{Argv: []string{"sleep", "60"}})
	a.must("POST", "/v1/sandboxes/hog/sessions/"+sleeper.ID+"/signal", wire.Signal{Signal: "KILL"}, 204, nil)
	got = a.waitEnded("hog", sleeper.ID)
	if e := got.Exit; e == nil || e.Reason != wire.ExitSignaled || e.Signal != 9 || e.OOMKilled {
		t.Fatalf("killed sleeper's exit: got %+v, want signaled 9 without oom_killed", got.Exit)
	}
}

// TestLimitsPlacement: a session's command runs in its own leaf under its
// sandbox's cgroup in every hierarchy, from its first instruction. The
// command copies its own /proc/self/cgroup first thing: the host's paths,
// or in a pod the view of its cgroup namespace, rooted at the holder's
// leaf _pod, so the session's leaf, its sibling, reads /../LEAF; the
// host's /proc/PID/cgroup of the same process names the leaf's parent.
func TestLimitsPlacement(t *testing.T) {
	a, root := limitsDaemon(t)
	sb := a.createLimited("place", wire.Limits{Pids: 100})
	ss := a.spawn("place", wire.CreateSession{Argv: []string{"sh", "-c", "cat /proc/self/cgroup > view.tmp && mv view.tmp view; exec sleep 60"}})
	cgroupLines := func(text string) map[string]string {
		lines := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
			parts := strings.SplitN(l, ":", 3)
			if len(parts) == 3 {
				lines[parts[1]] = parts[2]
			}
		}
		return lines
	}
	var inside string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(sb.WorkspaceOnHost(), "view")); err == nil {
			inside = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the session wrote no copy of its /proc/self/cgroup")
		}
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", ss.PID))
	if err != nil {
		t.Fatal(err)
	}
	in, host := cgroupLines(inside), cgroupLines(string(raw))
	for _, c := range []string{"memory", "pids", "cpu"} {
		leaf := findCgroupLine(host, c)
		dir := filepath.Dir(filepath.Join("/sys/fs/cgroup", c, leaf))
		if want := sbCgroup(root, c, "place"); dir != want {
			t.Errorf("%s: command's cgroup's parent is %s, want the sandbox's %s", c, dir, want)
		}
		want := leaf // its first instruction's view: the same leaf
		if sb.Pod {
			want = "/../" + filepath.Base(leaf)
		}
		if got := findCgroupLine(in, c); got != want {
			t.Errorf("%s: the command's own first view of its cgroup %q, want %q (host: %s)", c, got, want, leaf)
		}
	}
}

// findCgroupLine returns the path of controller c in /proc/PID/cgroup
// lines keyed by their controller lists.
func findCgroupLine(lines map[string]string, c string) string {
	for ctrls, p := range lines {
		if slices.Contains(strings.Split(ctrls, ","), c) {
			return p
		}
	}
	return ""
}

// TestLimitsForkBombStaysInItsSandbox: forks past the pids limit fail in
// their own sandbox while an exec in another sandbox completes.
func TestLimitsForkBombStaysInItsSandbox(t *testing.T) {
	a, root := limitsDaemon(t)
	a.createLimited("bomb", wire.Limits{Pids: 20})
	a.createSandbox("calm")
	// Bounded, so a broken placement cannot hurt the host: 200 sleepers
	// where 20 tasks are allowed.
	bomb := a.spawn("bomb", wire.CreateSession{Argv: []string{"sh", "-c",
		"n=0; for i in $(seq 200); do sleep 30 & n=$((n+1)); done 2>/dev/null; echo started; sleep 30"}})
	// The kernel counts a refused fork in the leaf of the forking task
	// (older kernels) or in the cgroup whose limit refused it.
	refused := func() bool {
		leafEv := readCgroup(t, filepath.Join(sbCgroup(root, "pids", "bomb"), bomb.ID), "pids.events")
		sbEv := readCgroup(t, sbCgroup(root, "pids", "bomb"), "pids.events")
		return leafEv != "max 0" || sbEv != "max 0"
	}
	deadline := time.Now().Add(20 * time.Second)
	for !refused() {
		if time.Now().After(deadline) {
			t.Fatalf("no fork refused; pids.current %s", readCgroup(t, sbCgroup(root, "pids", "bomb"), "pids.current"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n, _ := strconv.Atoi(readCgroup(t, sbCgroup(root, "pids", "bomb"), "pids.current")); n > 20 || n < 2 {
		t.Fatalf("pids.current of the bomb: %d, want at most its limit 20", n)
	}
	start := time.Now()
	res := a.exec("calm", wire.Exec{Argv: []string{"sh", "-c", "echo fine; sleep 0.01 & wait"}})
	if res.Exit.Code != 0 || string(res.Stdout) != "fine\n" {
		t.Fatalf("exec in the calm sandbox: %+v %q %q", res.Exit, res.Stdout, res.Stderr)
	}
	t.Logf("exec beside a bomb at its limit: %v", time.Since(start))
	a.must("POST", "/v1/sandboxes/bomb/sessions/"+bomb.ID+"/terminate", wire.Terminate{GraceMS: 100}, 200, nil)
}

// TestLimitsSurviveKill9: a sandbox's limits are in its cgroup and its
// record; kill -9 of runnerd changes neither, and the restarted runnerd
// answers them and keeps the running session in its cgroup.
func TestLimitsSurviveKill9(t *testing.T) {
	needV1Cgroups(t)
	state := t.TempDir()
	root := testCgroupRoot(t)
	a, p := startProcess(t, state, "--cgroup-root", root)
	want := wire.Limits{MemoryBytes: 64 << 20, Pids: 50, CPUWeight: 200, CPUQuotaUS: 50000, CPUPeriodUS: 100000}
	a.createLimited("keep", want)
	sess := a.spawn("keep", wire.CreateSession{Argv: []string{"sleep", "60"}})
	p.kill(syscall.SIGKILL)

	check := func(when string) {
		t.Helper()
		mem, pids, cpu := sbCgroup(root, "memory", "keep"), sbCgroup(root, "pids", "keep"), sbCgroup(root, "cpu", "keep")
		for _, c := range []struct{ dir, file, want string }{
			{mem, "memory.limit_in_bytes", strconv.Itoa(64 << 20)},
			{pids, "pids.max", "50"},
			{cpu, "cpu.shares", "2048"},
			{cpu, "cpu.cfs_quota_us", "50000"},
			{cpu, "cpu.cfs_period_us", "100000"},
		} {
			if got := readCgroup(t, c.dir, c.file); got != c.want {
				t.Errorf("%s: %s: got %s, want %s", when, c.file, got, c.want)
			}
		}
		procs := readCgroup(t, filepath.Join(pids, sess.ID), "cgroup.procs")
		if procs != strconv.Itoa(sess.PID) {
			t.Errorf("%s: the session's leaf holds %q, want its command %d", when, procs, sess.PID)
		}
	}
	check("after kill -9")
	a2, _ := startProcess(t, state, "--cgroup-root", root)
	check("after restart")
	var sb wire.Sandbox
	a2.must("GET", "/v1/sandboxes/keep", nil, 200, &sb)
	if sb.Limits == nil || *sb.Limits != want {
		t.Fatalf("limits after restart: got %+v, want %+v", sb.Limits, want)
	}
	// The sleeper, and a pod's holder (its threads), a task of the
	// sandbox's cgroup too.
	if holder := holderTasks(t, sbCgroup(root, "pids", "keep")); sb.Usage == nil || sb.Usage.Pids != uint64(1+holder) {
		t.Fatalf("usage after restart: got %+v, want the one sleeper and the pod holder's %d tasks", sb.Usage, holder)
	}
	a2.must("DELETE", "/v1/sandboxes/keep", nil, 204, nil)
	if _, err := os.Stat(sbCgroup(root, "memory", "keep")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("cgroup after destroy: %v, want gone", err)
	}
}

// TestLimitsParkResume: suspend removes the sandbox's cgroups, resume
// restores them with the same limits, and a session runs under them.
func TestLimitsParkResume(t *testing.T) {
	a, root := limitsDaemon(t)
	a.createLimited("park", wire.Limits{MemoryBytes: 48 << 20, Pids: 30})
	a.spawn("park", wire.CreateSession{Argv: []string{"sleep", "60"}})
	// The sleeper and a pod's holder (its threads).
	pids := 1 + holderTasks(t, sbCgroup(root, "pids", "park"))
	if m := string(a.do("GET", "/metrics", nil).body); !strings.Contains(m, fmt.Sprintf(`runnerd_sandbox_pids{sandbox="park"} %d`+"\n", pids)) {
		t.Fatalf("/metrics of a running sandbox with one sleeper (%d tasks with a pod's holder) lacks its pids series:\n%s", pids, m)
	}
	a.must("POST", "/v1/sandboxes/park/suspend", nil, 200, nil)
	// Cardinality: a suspended sandbox has no series (only running ones do).
	if m := string(a.do("GET", "/metrics", nil).body); strings.Contains(m, `sandbox="park"`) {
		t.Fatalf("/metrics has series of a suspended sandbox:\n%s", m)
	}
	var parked wire.Sandbox
	a.must("GET", "/v1/sandboxes/park", nil, 200, &parked)
	if parked.Usage != nil || parked.Limits == nil || parked.Limits.Pids != 30 {
		t.Fatalf("suspended sandbox: usage %+v limits %+v, want no usage and its limits kept", parked.Usage, parked.Limits)
	}
	for _, c := range []string{"memory", "pids", "cpu", "cpuacct"} {
		if _, err := os.Stat(sbCgroup(root, c, "park")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s cgroup of a suspended sandbox: %v, want gone", c, err)
		}
	}
	a.must("POST", "/v1/sandboxes/park/resume", nil, 200, nil)
	if got := readCgroup(t, sbCgroup(root, "memory", "park"), "memory.limit_in_bytes"); got != strconv.Itoa(48<<20) {
		t.Fatalf("memory limit after resume: %s", got)
	}
	if got := readCgroup(t, sbCgroup(root, "pids", "park"), "pids.max"); got != "30" {
		t.Fatalf("pids limit after resume: %s", got)
	}
	res := a.exec("park", wire.Exec{Argv: []string{"true"}})
	if res.Exit.Code != 0 {
		t.Fatalf("exec after resume: %+v", res.Exit)
	}
}

// TestLimitsRefusedWithoutCgroups: with --cgroups off the capability is
// absent and every limit is refused with not_supported, never accepted.
func TestLimitsRefusedWithoutCgroups(t *testing.T) {
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, Cgroups: daemon.CgroupsOff})
	if caps := a.capabilities(); slices.Contains(caps, wire.CapResourceLimits) {
		t.Fatalf("capabilities %v advertise %s with cgroups off", caps, wire.CapResourceLimits)
	}
	a.wantError(a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "x", Limits: &wire.Limits{MemoryBytes: 64 << 20}}), 501, wire.CodeNotSupported)
	if r := a.do("GET", "/v1/sandboxes/x", nil); r.status != 404 {
		t.Fatalf("a refused create left a sandbox: %d %s", r.status, r.body)
	}
	sb := a.createSandbox("plain")
	if sb.Limits != nil || sb.Usage != nil {
		t.Fatalf("plain sandbox: limits %+v usage %+v, want none", sb.Limits, sb.Usage)
	}
	a.wantError(a.do("PUT", "/v1/sandboxes/plain/limits", wire.Limits{Pids: 10}), 501, wire.CodeNotSupported)
	a.wantError(a.do("PUT", "/v1/sandboxes/nosuch/limits", wire.Limits{Pids: 10}), 404, wire.CodeNotFound)
	// And a config asking for default limits without cgroups is refused.
	err := daemon.Run(context.Background(), daemon.Config{StateDir: t.TempDir(), Cgroups: daemon.CgroupsOff, DefaultLimits: wire.Limits{Pids: 10}})
	if err == nil {
		t.Fatal("Run accepted default limits with cgroups off")
	}
}

// TestLimitsInvalid: bad values are 400 invalid at create and update, and
// change nothing.
func TestLimitsInvalid(t *testing.T) {
	a, root := limitsDaemon(t)
	a.createLimited("ok", wire.Limits{Pids: 40})
	for _, tc := range []struct {
		name string
		l    wire.Limits
	}{
		{"memory below 1 MiB", wire.Limits{MemoryBytes: 4096}},
		{"negative memory", wire.Limits{MemoryBytes: -1}},
		{"negative pids", wire.Limits{Pids: -5}},
		{"weight too high", wire.Limits{CPUWeight: 10001}},
		{"quota too small", wire.Limits{CPUQuotaUS: 10}},
		{"negative quota", wire.Limits{CPUQuotaUS: -100000}},
		{"period without quota", wire.Limits{CPUPeriodUS: 100000}},
		{"period too long", wire.Limits{CPUQuotaUS: 100000, CPUPeriodUS: 2000000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &api{t: t, base: a.base, hc: a.hc, token: a.token, state: a.state}
			a.wantError(a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "bad", Limits: &tc.l}), 400, wire.CodeInvalid)
			a.wantError(a.do("PUT", "/v1/sandboxes/ok/limits", tc.l), 400, wire.CodeInvalid)
		})
	}
	a.wantError(a.do("PUT", "/v1/sandboxes/ok/limits", `{"pids": "many"}`), 400, wire.CodeInvalid)
	if got := readCgroup(t, sbCgroup(root, "pids", "ok"), "pids.max"); got != "40" {
		t.Fatalf("pids.max after refused updates: %s, want 40", got)
	}
	if r := a.do("GET", "/v1/sandboxes/bad", nil); r.status != 404 {
		t.Fatalf("a refused create left a sandbox: %d", r.status)
	}
}

// TestLimitsLiveUpdateAndRecreate: PUT .../limits reaches the cgroup files
// of a running sandbox; a re-create without limits returns the sandbox as
// it is, with different ones is a conflict.
func TestLimitsLiveUpdateAndRecreate(t *testing.T) {
	a, root := limitsDaemon(t)
	a.createLimited("live", wire.Limits{MemoryBytes: 64 << 20})
	a.spawn("live", wire.CreateSession{Argv: []string{"sleep", "60"}})
	var sb wire.Sandbox
	a.must("PUT", "/v1/sandboxes/live/limits", wire.Limits{MemoryBytes: 96 << 20, Pids: 25, CPUQuotaUS: 20000}, 200, &sb)
	if sb.Limits == nil || *sb.Limits != (wire.Limits{MemoryBytes: 96 << 20, Pids: 25, CPUQuotaUS: 20000}) {
		t.Fatalf("answer's limits: %+v", sb.Limits)
	}
	for _, c := range []struct{ ctrl, file, want string }{
		{"memory", "memory.limit_in_bytes", strconv.Itoa(96 << 20)},
		{"pids", "pids.max", "25"},
		{"cpu", "cpu.cfs_quota_us", "20000"},
		{"cpu", "cpu.cfs_period_us", "100000"},
	} {
		if got := readCgroup(t, sbCgroup(root, c.ctrl, "live"), c.file); got != c.want {
			t.Errorf("%s: got %s, want %s", c.file, got, c.want)
		}
	}
	// Absent limits: the sandbox as it is.
	var again wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "live"}, 200, &again)
	if again.Limits == nil || again.Limits.Pids != 25 {
		t.Fatalf("re-create without limits: got %+v", again.Limits)
	}
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "live", Limits: &wire.Limits{MemoryBytes: 96 << 20, Pids: 25, CPUQuotaUS: 20000}}, 200, nil)
	a.wantError(a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "live", Limits: &wire.Limits{Pids: 26}}), 409, wire.CodeInvalid)
	// Removing the limits: the files read unlimited again.
	var cleared wire.Sandbox
	a.must("PUT", "/v1/sandboxes/live/limits", wire.Limits{}, 200, &cleared)
	if cleared.Limits != nil {
		t.Fatalf("limits after PUT {}: %+v, want none", cleared.Limits)
	}
	if got := readCgroup(t, sbCgroup(root, "pids", "live"), "pids.max"); got != "max" {
		t.Fatalf("pids.max after removing limits: %s", got)
	}
}

// TestLimitsSessionLeafRemovedWithSession: DELETE of a session removes its
// leaf; the sandbox's cgroup stays.
func TestLimitsSessionLeafRemovedWithSession(t *testing.T) {
	a, root := limitsDaemon(t)
	a.createLimited("leaf", wire.Limits{Pids: 64}) // room for a pod's holder (its threads)
	s := a.spawn("leaf", wire.CreateSession{Argv: []string{"true"}})
	a.waitEnded("leaf", s.ID)
	leaf := filepath.Join(sbCgroup(root, "pids", "leaf"), s.ID)
	if _, err := os.Stat(leaf); err != nil {
		t.Fatalf("leaf of an ended session: %v", err)
	}
	a.must("DELETE", "/v1/sandboxes/leaf/sessions/"+s.ID, nil, 204, nil)
	if _, err := os.Stat(leaf); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("leaf after DELETE: %v, want gone", err)
	}
	if _, err := os.Stat(sbCgroup(root, "pids", "leaf")); err != nil {
		t.Fatalf("sandbox cgroup after the session's DELETE: %v", err)
	}
}

// TestLimitsSessionLeafRemovedByRetention: the retention janitor's delete
// removes the session's leaf as DELETE does.
func TestLimitsSessionLeafRemovedByRetention(t *testing.T) {
	needV1Cgroups(t)
	root := testCgroupRoot(t)
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, CgroupRoot: root,
		SessionRetention: 300 * time.Millisecond, JanitorInterval: 50 * time.Millisecond})
	// Room for a pod's holder (a Go program: several threads) and the
	// session's helper and command.
	a.createLimited("ret", wire.Limits{Pids: 64})
	s := a.spawn("ret", wire.CreateSession{Argv: []string{"true"}})
	leaf := filepath.Join(sbCgroup(root, "pids", "ret"), s.ID)
	if _, err := os.Stat(leaf); err != nil {
		t.Fatalf("leaf of a new session: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(leaf); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("leaf still there after the retention")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := a.do("GET", "/v1/sandboxes/ret/sessions/"+s.ID, nil); r.status != 404 {
		t.Fatalf("session after the retention: %d, want 404", r.status)
	}
	if _, err := os.Stat(sbCgroup(root, "pids", "ret")); err != nil {
		t.Fatalf("sandbox cgroup after the retention: %v", err)
	}
}
