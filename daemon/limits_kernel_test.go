package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestLimitsBeyondTheKernel: a limit the kernel would refuse, round or
// clamp is 400 invalid naming the range, before anything is made (the
// issue's create of memory 64 MiB with pids 2^62 answered 503 and left a
// sandbox with no memory limit); an update to one keeps the old limits;
// a retried create with valid limits works and the kernel holds them.
func TestLimitsBeyondTheKernel(t *testing.T) {
	a, root := limitsDaemon(t)
	a.createLimited("ok", wire.Limits{Pids: 40, MemoryBytes: 64 << 20})
	for _, tc := range []struct {
		name   string
		l      wire.Limits
		range_ string
	}{
		{"pids 2^62 with memory", wire.Limits{MemoryBytes: 64 << 20, Pids: 1 << 62}, "4194304"},
		{"pids one above the kernel's", wire.Limits{Pids: 4194305}, "4194304"},
		{"memory not whole pages", wire.Limits{MemoryBytes: 64<<20 + 1}, fmt.Sprint(os.Getpagesize())},
		{"memory above the maximum", wire.Limits{MemoryBytes: 1<<62 + 4096}, "4611686018427387904"},
		{"quota above the kernel's", wire.Limits{CPUQuotaUS: 1 << 44}, "17592186044415"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &api{t: t, base: a.base, hc: a.hc, token: a.token, state: a.state}
			r := a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "bad", Limits: &tc.l})
			a.wantError(r, 400, wire.CodeInvalid)
			if d := r.errBody(t).Detail; !strings.Contains(d, tc.range_) {
				t.Errorf("create: detail %q does not name the bound %s", d, tc.range_)
			}
			r = a.do("PUT", "/v1/sandboxes/ok/limits", tc.l)
			a.wantError(r, 400, wire.CodeInvalid)
			if d := r.errBody(t).Detail; !strings.Contains(d, tc.range_) {
				t.Errorf("update: detail %q does not name the bound %s", d, tc.range_)
			}
			if r := a.do("GET", "/v1/sandboxes/bad", nil); r.status != 404 {
				t.Fatalf("a refused create left a sandbox: %d %s", r.status, r.body)
			}
			if _, err := os.Stat(sbCgroup(root, "memory", "bad")); !os.IsNotExist(err) {
				t.Errorf("a refused create left a cgroup: %v", err)
			}
		})
	}
	if got := readCgroup(t, sbCgroup(root, "pids", "ok"), "pids.max"); got != "40" {
		t.Errorf("pids.max after refused updates: %s, want 40", got)
	}
	if got := readCgroup(t, sbCgroup(root, "memory", "ok"), "memory.limit_in_bytes"); got != "67108864" {
		t.Errorf("memory.limit_in_bytes after refused updates: %s, want 67108864", got)
	}
	// The retry of the create, valid now.
	sb := a.createLimited("bad", wire.Limits{MemoryBytes: 64 << 20, Pids: 4194304})
	if sb.Limits == nil || sb.Limits.Pids != 4194304 || sb.Limits.MemoryBytes != 64<<20 {
		t.Fatalf("retried create: limits %+v", sb.Limits)
	}
	if got := readCgroup(t, sbCgroup(root, "memory", "bad"), "memory.limit_in_bytes"); got != "67108864" {
		t.Errorf("retried create: memory.limit_in_bytes %s, want 67108864", got)
	}
	if got := readCgroup(t, sbCgroup(root, "pids", "bad"), "pids.max"); got != "4194304" {
		t.Errorf("retried create: pids.max %s, want 4194304", got)
	}
}

// chargeShmem charges mib MiB of tmpfs pages to the memory cgroup dir: a
// process placed there writes a file under /dev/shm and exits; the pages
// stay charged (without swap the kernel cannot reclaim them), so a memory
// limit below them fails (EBUSY) when the kernel is asked to hold it.
func chargeShmem(t *testing.T, dir string, mib int) {
	t.Helper()
	f := filepath.Join("/dev/shm", fmt.Sprintf("runner-test-%d-%s", os.Getpid(), filepath.Base(dir)))
	t.Cleanup(func() { os.Remove(f) })
	cmd := exec.Command("/bin/sh", "-c", `echo $$ > "$1/cgroup.procs" && exec dd if=/dev/zero of="$2" bs=1M count="$3" status=none`, "sh", dir, f, strconv.Itoa(mib))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("charge %s: %v: %s", dir, err, out)
	}
}

// TestFailedCreateLeavesNothing: a create whose limit the kernel refuses
// once it is tried (a memory limit below what the cgroup already holds)
// answers the failure and leaves no sandbox, workspace or cgroup; its
// retry works. Before, the record stayed (with the limit GET showed and
// the kernel did not hold).
func TestFailedCreateLeavesNothing(t *testing.T) {
	a, root := limitsDaemon(t)
	dir := sbCgroup(root, "memory", "held")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// 48 MiB charged, a 32 MiB limit: room, once retried, for a pod's
	// holder (a Go program), which 1 MiB had not ("make pod: holder
	// said \"\" (EOF)").
	chargeShmem(t, dir, 48)
	r := a.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "held", Limits: &wire.Limits{MemoryBytes: 32 << 20}})
	a.wantError(r, 503, wire.CodeUnavailable)
	if r := a.do("GET", "/v1/sandboxes/held", nil); r.status != 404 {
		t.Fatalf("a failed create left a sandbox: %d %s", r.status, r.body)
	}
	if _, err := os.Stat(filepath.Join(a.state, "sandboxes", "held")); !os.IsNotExist(err) {
		t.Errorf("a failed create left its workspace: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a failed create left its cgroup: %v", err)
	}
	sb := a.createLimited("held", wire.Limits{MemoryBytes: 32 << 20})
	if got := readCgroup(t, dir, "memory.limit_in_bytes"); got != "33554432" || sb.Limits == nil || sb.Limits.MemoryBytes != 32<<20 {
		t.Errorf("retried create: kernel %s, record %+v; want 33554432 both", got, sb.Limits)
	}
}

// TestFailedUpdateKeepsOldLimits: an update the kernel refuses half-way
// (pids written, then a memory limit below what the sandbox holds)
// leaves the old limits in the kernel and in the record.
func TestFailedUpdateKeepsOldLimits(t *testing.T) {
	a, root := limitsDaemon(t)
	old := wire.Limits{MemoryBytes: 64 << 20, Pids: 40}
	a.createLimited("busy", old)
	chargeShmem(t, sbCgroup(root, "memory", "busy"), 8)
	r := a.do("PUT", "/v1/sandboxes/busy/limits", wire.Limits{MemoryBytes: 1 << 20, Pids: 10})
	a.wantError(r, 409, wire.CodeInvalid)
	if d := r.errBody(t).Detail; !strings.Contains(d, "the old limits stay") {
		t.Errorf("detail %q does not say the old limits stay", d)
	}
	if got := readCgroup(t, sbCgroup(root, "pids", "busy"), "pids.max"); got != "40" {
		t.Errorf("pids.max after a failed update: %s, want the old 40", got)
	}
	if got := readCgroup(t, sbCgroup(root, "memory", "busy"), "memory.limit_in_bytes"); got != "67108864" {
		t.Errorf("memory.limit_in_bytes after a failed update: %s, want the old 67108864", got)
	}
	var sb wire.Sandbox
	a.must("GET", "/v1/sandboxes/busy", nil, 200, &sb)
	if sb.Limits == nil || *sb.Limits != old {
		t.Errorf("GET limits after a failed update: %+v, want %+v", sb.Limits, old)
	}
}
