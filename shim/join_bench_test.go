package shim

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Candidates for joining a sandbox's namespaces at each start (issue #24,
// "cheap"), each measured beside the plain fork/exec baseline
// (BenchmarkForkExecTrue): start /bin/true that way and wait for it. A Go
// process cannot setns(2) into a user or mount namespace once its runtime
// has started threads, so the join must happen in a single-threaded
// program in the chain (nsenter), a runtime that does it (crun exec), or
// before the Go runtime (a cgo constructor, runc's nsexec.c model: not
// measured here, it is not written; nor is crun exec: Debian 12's crun
// 1.8.1 refuses this host's hybrid cgroup layout, "cgroups in hybrid mode
// not supported", even with --cgroup-manager=disabled). bwrap and unshare make fresh
// namespaces per start (the alternative to a holder) for comparison.
// Root only; a missing tool skips. Run on a quiet machine, all in one run:
//
//	go test ./shim/ -run '^$' -bench 'ForkExecTrue|Join' -benchtime 200x -count 5
//
// and compare each ns/op with BenchmarkForkExecTrue's of the same run.

// holder starts a process holding fresh user (root mapped to root), mount,
// pid, uts, ipc and network namespaces, as a sandbox's holder would, and
// returns the pid inside them (unshare's forked child).
func holder(b *testing.B) int {
	b.Helper()
	cmd := exec.Command("unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "--uts", "--ipc", "--net", "sleep", "1000")
	if err := cmd.Start(); err != nil {
		b.Skipf("SKIPPED: unshare: %v", err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		if f := strings.Fields(string(raw)); len(f) > 0 {
			pid, _ := strconv.Atoi(f[0])
			return pid
		}
	}
	b.Fatal("the holder's child never appeared")
	return 0
}

func benchArgv(b *testing.B, argv ...string) {
	b.Helper()
	if _, err := exec.LookPath(argv[0]); err != nil {
		b.Skipf("SKIPPED: %s is not installed", argv[0])
	}
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		b.Fatalf("%v: %v\n%s", argv, err, out)
	}
	for b.Loop() {
		cmd := exec.Command(argv[0], argv[1:]...)
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJoinNsenter: util-linux nsenter (C, single-threaded) joins a
// holder's six namespaces, then execs /bin/true: one extra exec per start.
func BenchmarkJoinNsenter(b *testing.B) {
	needRootB(b)
	pid := strconv.Itoa(holder(b))
	benchArgv(b, "nsenter", "-t", pid, "-U", "-m", "-p", "-u", "-i", "-n", "--preserve-credentials", "/bin/true")
}

// BenchmarkJoinFreshUnshare: unshare(1) makes the same six namespaces
// anew for every start (what a per-command namespace costs).
func BenchmarkJoinFreshUnshare(b *testing.B) {
	needRootB(b)
	benchArgv(b, "unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "--uts", "--ipc", "--net", "/bin/true")
}

// BenchmarkJoinFreshBwrap: bubblewrap with fresh user, mount, pid, uts,
// ipc and network namespaces and the host's / read-only, per start.
func BenchmarkJoinFreshBwrap(b *testing.B) {
	needRootB(b)
	benchArgv(b, "bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "/bin/true")
}

func needRootB(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIPPED: needs root (namespaces)")
	}
}
