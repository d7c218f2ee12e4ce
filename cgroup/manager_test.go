package cgroup

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"

	"github.com/agentrunner/runner/internal/testcap"
)

// newTestManager returns a Manager whose Root is a fresh cgroup inside the
// test process's own cgroups, removed with everything in it at cleanup.
func newTestManager(t *testing.T, mode Mode) *Manager {
	t.Helper()
	testcap.Root(t, "cgroup tests create cgroups")
	switch mode {
	case ModeV1:
		if cgroups.Mode() == cgroups.Unified {
			t.Skip("SKIP: this host is pure cgroup v2; the v1 tests need the v1 or hybrid layout")
		}
	case ModeV2:
		if cgroups.Mode() == cgroups.Legacy || cgroups.Mode() == cgroups.Unavailable {
			t.Skip("SKIP: this host has no cgroup2 mount")
		}
	}
	var b [6]byte
	rand.Read(b[:])
	m, err := New(Config{Mode: mode, Root: "runner-test-" + hex.EncodeToString(b[:])})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		names, err := m.List()
		if err != nil {
			t.Errorf("cleanup: List: %v", err)
		}
		for _, n := range names {
			if err := m.Remove(ctx, n); err != nil {
				t.Errorf("cleanup: Remove %s: %v", n, err)
			}
		}
		for _, d := range m.b.rootDirs() {
			if err := rmdirTree(d); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return m
}

// proc is a started test process; done closes once it has been waited for.
type proc struct {
	cmd    *exec.Cmd
	stdout string // file holding its stdout
	stderr string // file holding its stderr
	done   chan struct{}
	state  *os.ProcessState
}

// startIn starts argv with its pid already in dirs before it runs
// anything of its own: a shell waits on stdin, is placed, is released, and
// execs argv (the same pid, so what is placed is what runs). Its stderr
// goes to a file, so no pipe held by a surviving grandchild delays Wait.
func startIn(t *testing.T, dirs []string, argv ...string) *proc {
	t.Helper()
	return startAs(t, dirs, nil, argv...)
}

// startAs is startIn with the process's credentials set to cred.
func startAs(t *testing.T, dirs []string, cred *syscall.Credential, argv ...string) *proc {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", `read x; exec "$@"`, "sh"}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	errFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close()
	cmd.Stderr = errFile
	outFile, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	cmd.Stdout = outFile
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, stdout: outFile.Name(), stderr: errFile.Name(), done: make(chan struct{})}
	go func() {
		cmd.Wait()
		p.state = cmd.ProcessState
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("place %d in %s: %v", cmd.Process.Pid, d, err)
		}
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	in.Close()
	return p
}

// wait returns p's exit state, failing the test after within.
func (p *proc) wait(t *testing.T, within time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-p.done:
		return p.state
	case <-time.After(within):
		t.Fatalf("pid %d still running after %v", p.cmd.Process.Pid, within)
		return nil
	}
}

// alive reports whether p has not exited.
func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// dead reports whether pid is gone or a zombie (an orphan's reaper may
// take its time).
func dead(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// dirOf returns the entry of dirs in the given v1 hierarchy.
func dirOf(t *testing.T, dirs []string, hierarchy string) string {
	t.Helper()
	for _, d := range dirs {
		if strings.HasPrefix(d, "/sys/fs/cgroup/"+hierarchy+"/") {
			return d
		}
	}
	t.Fatalf("no %s directory in %v", hierarchy, dirs)
	return ""
}

// sandboxDir is the v1 directory of sandbox name in hierarchy.
func sandboxDir(t *testing.T, m *Manager, name, hierarchy string) string {
	t.Helper()
	dirs, err := m.b.(*v1).dirs(name)
	if err != nil {
		t.Fatal(err)
	}
	return dirOf(t, dirs, hierarchy)
}

func signalOf(ps *os.ProcessState) syscall.Signal {
	ws := ps.Sys().(syscall.WaitStatus)
	if !ws.Signaled() {
		return 0
	}
	return ws.Signal()
}

func TestV1Available(t *testing.T) {
	m := newTestManager(t, ModeV1)
	if m.Mode() != ModeV1 {
		t.Fatalf("Mode = %v, want v1", m.Mode())
	}
	if err := m.Available(); err != nil {
		t.Fatalf("Available = %v, want nil on a root host with memory, pids, cpu, cpuacct", err)
	}
}

func TestV1OOMKillIsCountedInItsLeafOnly(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{MemoryBytes: 32 << 20})
	hogDirs := sessionDirs(t, m, "sb", "hog")
	idleDirs := sessionDirs(t, m, "sb", "idle")
	idle := startIn(t, idleDirs, "sleep", "60")
	// tail buffers every byte of a file without newlines: it grows until
	// the sandbox's 32 MiB are gone.
	hog := startIn(t, hogDirs, "tail", "/dev/zero")
	ps := hog.wait(t, 30*time.Second)
	if sig := signalOf(ps); sig != syscall.SIGKILL {
		t.Fatalf("hog ended with %v, want killed by SIGKILL", ps)
	}
	if n, err := OOMKills(hogDirs); err != nil || n < 1 {
		t.Fatalf("OOMKills(hog) = %d, %v; want >= 1", n, err)
	}
	if n, err := OOMKills(idleDirs); err != nil || n != 0 {
		t.Fatalf("OOMKills(idle) = %d, %v; want 0", n, err)
	}
	if !idle.alive() {
		t.Fatalf("idle session died with the hog: %v", idle.state)
	}
	u, err := m.Usage("sb")
	if err != nil {
		t.Fatal(err)
	}
	if u.OOMKills < 1 || u.MemoryPeakBytes < 30<<20 || u.MemoryPeakBytes > 32<<20 {
		t.Fatalf("Usage = %+v; want OOMKills >= 1 and a peak near the 32 MiB limit", u)
	}
}

func TestV1ForkBombStopsAtPids(t *testing.T) {
	m := newTestManager(t, ModeV1)
	const limit = 20
	ensure(t, m, "sb", Limits{Pids: limit})
	dirs := sessionDirs(t, m, "sb", "bomb")
	// 100 background sleeps: the shell's fork fails at the limit, it
	// says so and exits non-zero, and the sleeps it did start stay.
	bomb := startIn(t, dirs, "sh", "-c", `i=0; while [ $i -lt 100 ]; do sleep 60 & i=$((i+1)); done; echo all-forked`)
	ps := bomb.wait(t, 30*time.Second)
	stderr := readFile(t, bomb.stderr)
	if ps.Success() {
		t.Fatalf("fork bomb exited 0 (stderr %q): it forked 100 children under pids %d", stderr, limit)
	}
	if !strings.Contains(stderr, "fork") {
		t.Fatalf("fork bomb stderr %q, want the shell's fork failure", stderr)
	}
	// v1 records the refusal in the cgroup of the task that forked.
	events := readFile(t, filepath.Join(dirOf(t, dirs, "pids"), "pids.events"))
	if events == "max 0" || !strings.HasPrefix(events, "max ") {
		t.Fatalf("pids.events = %q, want max > 0 (the kernel refused a fork)", events)
	}
	u, err := m.Usage("sb")
	if err != nil {
		t.Fatal(err)
	}
	if u.Pids == 0 || u.Pids > limit {
		t.Fatalf("Usage.Pids = %d, want 1..%d (the sleeps that did start)", u.Pids, limit)
	}
	// Removal takes the leftover sleeps, which are not our children.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Remove(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
}

func TestV1UsageMoves(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{MemoryBytes: 256 << 20})
	u0, err := m.Usage("sb")
	if err != nil {
		t.Fatal(err)
	}
	if u0 != (Usage{}) {
		t.Fatalf("Usage of an empty new cgroup = %+v, want zero", u0)
	}
	dirs := sessionDirs(t, m, "sb", "s1")
	// Burn some CPU, then hold ~24 MB in a shell variable while sleeping.
	cmd := startIn(t, dirs, "sh", "-c", `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; x=$(head -c 24000000 /dev/zero | tr '\0' a); echo ready >&2; sleep 60`)
	deadline := time.Now().Add(20 * time.Second)
	var u Usage
	for {
		if u, err = m.Usage("sb"); err != nil {
			t.Fatal(err)
		}
		if u.MemoryBytes >= 24000000 && u.Pids == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Usage = %+v; want memory >= 24 MB and 2 pids (sh and sleep)", u)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if u.MemoryPeakBytes < u.MemoryBytes {
		t.Fatalf("peak %d below current %d", u.MemoryPeakBytes, u.MemoryBytes)
	}
	if u.CPUTime < 50*time.Millisecond {
		t.Fatalf("CPUTime = %v after a 200000-step shell loop, want >= 50ms", u.CPUTime)
	}
	cmd.cmd.Process.Kill()
	ps := cmd.wait(t, 10*time.Second)
	// The cgroup's CPU time covers at least what the kernel charged the
	// shell itself (plus its children: head, tr, sleep).
	own := ps.UserTime() + ps.SystemTime()
	u2, err := m.Usage("sb")
	if err != nil {
		t.Fatal(err)
	}
	if u2.CPUTime < own-10*time.Millisecond {
		t.Fatalf("cgroup CPUTime %v < the shell's own %v", u2.CPUTime, own)
	}
	if u2.MemoryPeakBytes < u.MemoryBytes {
		t.Fatalf("peak %d fell below the earlier usage %d", u2.MemoryPeakBytes, u.MemoryBytes)
	}
}

func TestV1EnsureIdempotentAndUpdateLive(t *testing.T) {
	m := newTestManager(t, ModeV1)
	l := Limits{MemoryBytes: 64 << 20, Pids: 50, CPUWeight: 200, CPUQuota: 50 * time.Millisecond}
	want := map[string]string{
		"memory/memory.limit_in_bytes":       "67108864",
		"memory/memory.memsw.limit_in_bytes": "67108864",
		"pids/pids.max":                      "50",
		"cpu/cpu.shares":                     "2048",
		"cpu/cpu.cfs_quota_us":               "50000",
		"cpu/cpu.cfs_period_us":              "100000",
	}
	check := func(t *testing.T, want map[string]string) {
		t.Helper()
		for f, v := range want {
			hier, file, _ := strings.Cut(f, "/")
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", hier, file)); errors.Is(err, os.ErrNotExist) {
				continue // memsw without swap accounting
			}
			if got := readFile(t, filepath.Join(sandboxDir(t, m, "sb", hier), file)); got != v {
				t.Errorf("%s = %s, want %s", f, got, v)
			}
		}
	}
	for i := 0; i < 2; i++ {
		if err := m.Ensure("sb", l); err != nil {
			t.Fatalf("Ensure #%d: %v", i+1, err)
		}
		check(t, want)
	}
	dirs := sessionDirs(t, m, "sb", "s1")
	cmd := startIn(t, dirs, "sleep", "60")
	// Ensure again on the live cgroup: same limits, the process stays.
	ensure(t, m, "sb", l)
	if names, _ := m.List(); !slices.Equal(names, []string{"sb"}) {
		t.Fatalf("List = %v, want [sb]", names)
	}
	if err := m.Update("sb", Limits{MemoryBytes: 128 << 20, CPUQuota: 2 * time.Second, CPUPeriod: time.Second}); err != nil {
		t.Fatal(err)
	}
	unlimited := readFile(t, "/sys/fs/cgroup/memory/memory.limit_in_bytes")
	check(t, map[string]string{
		"memory/memory.limit_in_bytes":       "134217728",
		"memory/memory.memsw.limit_in_bytes": "134217728",
		"pids/pids.max":                      "max",
		"cpu/cpu.shares":                     "1024",
		"cpu/cpu.cfs_quota_us":               "2000000",
		"cpu/cpu.cfs_period_us":              "1000000",
	})
	if err := m.Update("sb", Limits{}); err != nil {
		t.Fatal(err)
	}
	check(t, map[string]string{
		"memory/memory.limit_in_bytes":       unlimited,
		"memory/memory.memsw.limit_in_bytes": unlimited,
		"pids/pids.max":                      "max",
		"cpu/cpu.cfs_quota_us":               "-1",
		"cpu/cpu.cfs_period_us":              "100000",
	})
	if err := m.Update("sb", Limits{MemoryBytes: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	check(t, map[string]string{"memory/memory.limit_in_bytes": "16777216", "memory/memory.memsw.limit_in_bytes": "16777216"})
	if !cmd.alive() {
		t.Fatalf("the session's process died across Ensure/Update: %v", cmd.state)
	}
	if err := m.Update("nope", l); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Update of a missing sandbox = %v, want ErrNotFound", err)
	}
	if _, err := m.Usage("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Usage of a missing sandbox = %v, want ErrNotFound", err)
	}
	if _, err := m.SessionDirs("nope", "s"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SessionDirs of a missing sandbox = %v, want ErrNotFound", err)
	}
}

func TestV1RemoveKillsAndRemoves(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{Pids: 100})
	dirs := sessionDirs(t, m, "sb", "s1")
	// A direct child, and an orphan it leaves behind (reparented away from
	// us, as a sandbox's double-forked daemon would be).
	pidFile := filepath.Join(t.TempDir(), "orphan")
	cmd := startIn(t, dirs, "sh", "-c", `sleep 600 & echo $! > "$0"; exec sleep 600`, pidFile)
	var orphan int
	deadline := time.Now().Add(10 * time.Second)
	for orphan == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if b, err := os.ReadFile(pidFile); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			orphan, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	if orphan == 0 {
		t.Fatal("the orphan's pid never appeared")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	removeKilling(t, ctx, m, "sb", cmd)
	if !dead(orphan) {
		t.Fatalf("orphan %d survived Remove", orphan)
	}
	checkGone(t, "Remove", append(dirs, sandboxDir(t, m, "sb", "memory"))...)
	if names, _ := m.List(); len(names) != 0 {
		t.Fatalf("List after Remove = %v, want none", names)
	}
	removeAbsent(t, ctx, m, "sb")
}

func TestV1RemoveSession(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{})
	d1 := sessionDirs(t, m, "sb", "s1")
	d2 := sessionDirs(t, m, "sb", "s2")
	c1 := startIn(t, d1, "sleep", "60")
	c2 := startIn(t, d2, "sleep", "60")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.RemoveSession(ctx, "sb", "s1"); err != nil {
		t.Fatal(err)
	}
	if ps := c1.wait(t, 10*time.Second); signalOf(ps) != syscall.SIGKILL {
		t.Fatalf("s1 ended %v, want SIGKILL", ps)
	}
	if !c2.alive() {
		t.Fatalf("s2 died with s1: %v", c2.state)
	}
	checkGone(t, "RemoveSession", d1...)
	if err := m.RemoveSession(ctx, "sb", "s1"); err != nil {
		t.Fatalf("RemoveSession of an absent leaf = %v, want nil", err)
	}
}

func TestV1RemoveBoundedByContext(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{})
	dirs := sessionDirs(t, m, "sb", "s1")
	startIn(t, dirs, "sleep", "60")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Even with ctx already done the first round of kills runs; what must
	// not happen is an unbounded wait.
	start := time.Now()
	err := m.Remove(ctx, "sb")
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Remove with a cancelled ctx = %v, want nil or context.Canceled", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("Remove with a cancelled ctx took %v", time.Since(start))
	}
}

func TestNewKeepsExistingSandboxes(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "a", Limits{Pids: 7})
	ensure(t, m, "b", Limits{})
	// A restarted runnerd builds a new Manager on the same root.
	root := filepath.Base(m.b.rootDirs()[0])
	m2, err := New(Config{Mode: ModeV1, Root: root})
	if err != nil {
		t.Fatal(err)
	}
	names, err := m2.List()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"a", "b"}) {
		t.Fatalf("List after restart = %v, want [a b]", names)
	}
	if got := readFile(t, filepath.Join(sandboxDir(t, m2, "a", "pids"), "pids.max")); got != "7" {
		t.Fatalf("pids.max after restart = %s, want 7", got)
	}
}

func TestInvalidRefused(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{})
	outside := filepath.Join(filepath.Dir(m.b.rootDirs()[0]), "escape")
	for _, name := range []string{"", ".", "..", "../escape", "a/b", "x\x00y", strings.Repeat("a", 256)} {
		if err := m.Ensure(name, Limits{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Ensure(%q) = %v, want ErrInvalid", name, err)
		}
		if _, err := m.SessionDirs("sb", name); !errors.Is(err, ErrInvalid) {
			t.Errorf("SessionDirs(sb, %q) = %v, want ErrInvalid", name, err)
		}
		if err := m.Remove(context.Background(), name); !errors.Is(err, ErrInvalid) {
			t.Errorf("Remove(%q) = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := os.Stat(outside); !errors.Is(err, os.ErrNotExist) {
		os.Remove(outside)
		t.Fatalf("a name climbed out of root: %s exists", outside)
	}
	if err := m.Ensure("sb2", Limits{MemoryBytes: 1000}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Ensure with 1000 bytes of memory = %v, want ErrInvalid", err)
	}
	if err := m.Update("sb", Limits{Pids: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Update with pids -1 = %v, want ErrInvalid", err)
	}
	if names, _ := m.List(); !slices.Equal(names, []string{"sb"}) {
		t.Fatalf("List = %v, want [sb]: a refused Ensure created something", names)
	}
	// A root of "/" would make every cgroup of the host a "sandbox" that
	// List reports and Remove kills.
	for _, root := range []string{"../../x", "/", "/../..", ".", "a/../b"} {
		if _, err := New(Config{Mode: ModeV1, Root: root}); !errors.Is(err, ErrInvalid) {
			t.Errorf("New with root %q = %v, want ErrInvalid", root, err)
		}
	}
}

// TestV2OnThisHost exercises what the unified hierarchy can do here. On a
// hybrid host it has no controllers: placement, kill and removal work,
// limits and usage are refused with ErrNotSupported.
func TestV2OnThisHost(t *testing.T) {
	m := newTestManager(t, ModeV2)
	if m.Mode() != ModeV2 {
		t.Fatalf("Mode = %v, want v2", m.Mode())
	}
	avail := m.Available()
	if cgroups.Mode() == cgroups.Hybrid {
		if !errors.Is(avail, ErrNotSupported) || !strings.Contains(avail.Error(), "memory") {
			t.Fatalf("Available on a hybrid host = %v, want ErrNotSupported naming the missing memory controller", avail)
		}
	}
	if avail != nil {
		if err := m.Ensure("sb", Limits{MemoryBytes: 64 << 20}); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("Ensure with limits where Available = %v: %v, want ErrNotSupported", avail, err)
		}
		if names, _ := m.List(); len(names) != 0 {
			t.Fatalf("a refused Ensure created %v", names)
		}
	}
	ensure(t, m, "sb", Limits{})
	if err := m.Ensure("sb", Limits{}); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	dirs := sessionDirs(t, m, "sb", "s1")
	if len(dirs) != 1 {
		t.Fatalf("SessionDirs = %v, want one v2 directory", dirs)
	}
	if avail != nil {
		if _, err := m.Usage("sb"); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("Usage where Available = %v: %v, want ErrNotSupported", avail, err)
		}
		if _, err := OOMKills(dirs); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("OOMKills without a memory controller: %v, want ErrNotSupported", err)
		}
	}
	cmd := startIn(t, dirs, "sh", "-c", `sleep 600 & exec sleep 600`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs := readFile(t, filepath.Join(dirs[0], "cgroup.procs"))
		if len(strings.Fields(procs)) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cgroup.procs = %q, want the shell and its background sleep", procs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p, ok := procCgroup(cmd.cmd.Process.Pid, ""); !ok || !strings.HasSuffix(p, "/sb/s1") {
		t.Fatalf("/proc/%d/cgroup v2 path = %q, want .../sb/s1", cmd.cmd.Process.Pid, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	removeKilling(t, ctx, m, "sb", cmd)
	checkGone(t, "Remove", dirs[0])
	removeAbsent(t, ctx, m, "sb")
}

// TestKillSparesProcessesOutside is the pid-reuse attack on Remove: a pid
// read from cgroup.procs that, by the time it is signalled, names a
// process outside the sandbox (here listed on purpose) must not be killed.
func TestKillSparesProcessesOutside(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{})
	dirs := sessionDirs(t, m, "sb", "s1")
	inside := startIn(t, dirs, "sleep", "60")
	outside := startIn(t, nil, "sleep", "60")
	member, err := m.b.(*v1).member("sb")
	if err != nil {
		t.Fatal(err)
	}
	if !member(inside.cmd.Process.Pid) || member(outside.cmd.Process.Pid) {
		t.Fatalf("member(inside) = %v, member(outside) = %v; want true, false", member(inside.cmd.Process.Pid), member(outside.cmd.Process.Pid))
	}
	procs := func() ([]int, error) {
		if !inside.alive() {
			return nil, nil
		}
		return []int{outside.cmd.Process.Pid, inside.cmd.Process.Pid}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := killAll(ctx, procs, member); err != nil {
		t.Fatal(err)
	}
	if ps := inside.wait(t, 10*time.Second); signalOf(ps) != syscall.SIGKILL {
		t.Fatalf("inside ended %v, want SIGKILL", ps)
	}
	time.Sleep(50 * time.Millisecond)
	if !outside.alive() {
		t.Fatalf("a process outside the cgroup was killed: %v", outside.state)
	}
}

// TestUnprivilegedCommandCannotLeaveOrLift is a hostile command running as
// a sandbox's unprivileged identity: it tries to move itself out of its
// leaf (to the sandbox, to Root, to the hierarchy root), to lift its
// sandbox's limits, and to make a cgroup of its own. Every attempt must
// fail: the directories and files are root's and not writable by others.
func TestUnprivilegedCommandCannotLeaveOrLift(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{MemoryBytes: 64 << 20, Pids: 50})
	dirs := sessionDirs(t, m, "sb", "s1")
	mem := dirOf(t, dirs, "memory")
	targets := []string{
		filepath.Join(sandboxDir(t, m, "sb", "memory"), "cgroup.procs"),
		filepath.Join(m.b.rootDirs()[0], "cgroup.procs"),
		"/sys/fs/cgroup/memory/cgroup.procs",
		filepath.Join(sandboxDir(t, m, "sb", "pids"), "cgroup.procs"),
	}
	lifts := []string{
		filepath.Join(sandboxDir(t, m, "sb", "memory"), "memory.limit_in_bytes"),
		filepath.Join(sandboxDir(t, m, "sb", "pids"), "pids.max"),
		filepath.Join(mem, "memory.limit_in_bytes"),
	}
	script := `
for f in ` + strings.Join(targets, " ") + `; do echo $$ 2>/dev/null > "$f" && echo "ESCAPED $f"; done
for f in ` + strings.Join(lifts, " ") + `; do for v in -1 max; do echo $v 2>/dev/null > "$f" && echo "LIFTED $f"; done; done
mkdir ` + filepath.Join(mem, "mine") + ` 2>/dev/null && echo "MKDIR"
cat /proc/self/cgroup
exit 0`
	p := startAs(t, dirs, &syscall.Credential{Uid: 65534, Gid: 65534}, "sh", "-c", script)
	if ps := p.wait(t, 10*time.Second); !ps.Success() {
		t.Fatalf("hostile script ended %v (stderr %q)", ps, readFile(t, p.stderr))
	}
	got := readFile(t, p.stdout) + "\n"
	for _, bad := range []string{"ESCAPED", "LIFTED", "MKDIR"} {
		if strings.Contains(got, bad) {
			t.Fatalf("an unprivileged command got out:\n%s", got)
		}
	}
	rel, err := m.b.(*v1).path("sb", "s1")(cgroup1.Memory)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, ":memory:"+rel+"\n") {
		t.Fatalf("the command's /proc/self/cgroup:\n%s\nwant it still in memory:%s", got, rel)
	}
}

// TestV1AvailableNamesMissingControllers: a v1 layout with only a memory
// hierarchy (a directory tree standing in for the mounts) cannot enforce
// pids or cpu, says so, and refuses limits.
func TestV1AvailableNamesMissingControllers(t *testing.T) {
	mount := t.TempDir()
	if err := os.Mkdir(filepath.Join(mount, "memory"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Mode: ModeV1, Mountpoint: mount, Root: "/runner"})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Available()
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "[pids cpu cpuacct]") {
		t.Fatalf("Available = %v, want ErrNotSupported naming pids, cpu, cpuacct", err)
	}
	if err := m.Ensure("sb", Limits{Pids: 10}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Ensure with limits = %v, want ErrNotSupported", err)
	}
	if _, err := m.Usage("sb"); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Usage = %v, want ErrNotSupported", err)
	}
	if _, err := os.Stat(filepath.Join(mount, "memory", "runner", "sb")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused Ensure created the sandbox (%v)", err)
	}
	if _, err := New(Config{Mode: ModeV1, Mountpoint: t.TempDir()}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("New on a tree with no v1 controller = %v, want ErrNotSupported", err)
	}
}

// TestV1CPUQuotaThrottles: a busy loop under a 5 ms per 100 ms quota gets
// about a twentieth of a CPU, not a whole one.
func TestV1CPUQuotaThrottles(t *testing.T) {
	m := newTestManager(t, ModeV1)
	ensure(t, m, "sb", Limits{CPUQuota: 5 * time.Millisecond})
	dirs := sessionDirs(t, m, "sb", "s1")
	startIn(t, dirs, "sh", "-c", "while :; do :; done")
	const wall = time.Second
	time.Sleep(wall)
	u, err := m.Usage("sb")
	if err != nil {
		t.Fatal(err)
	}
	// 5% of one second is 50 ms; allow a period's worth of slack at each
	// end of the window. Unthrottled, the loop gets a whole core (or on a
	// loaded host at least a third of one, measured: 350 ms).
	if u.CPUTime > 150*time.Millisecond {
		t.Fatalf("CPUTime = %v in %v under a 5%% quota, want <= 150ms", u.CPUTime, wall)
	}
	stat := readFile(t, filepath.Join(sandboxDir(t, m, "sb", "cpu"), "cpu.stat")) + "\n"
	if !strings.Contains(stat, "nr_throttled ") || strings.Contains(stat, "nr_throttled 0\n") {
		t.Fatalf("cpu.stat = %q, want nr_throttled > 0", stat)
	}
}
