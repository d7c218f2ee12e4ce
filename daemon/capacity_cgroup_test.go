package daemon_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestCapacityUnderCgroupRoot: with limits on the sandboxes' cgroup root,
// GET /v1/capacity reports that root's limits less what its sandboxes
// hold, and says so (source "cgroup"); without cgroups it reports the
// host's figures (source "host").
func TestCapacityUnderCgroupRoot(t *testing.T) {
	needV1Cgroups(t)
	root := testCgroupRoot(t)
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, CgroupRoot: root})
	h := cgroupHierarchies()
	pidsDir, memDir := filepath.Join(h["pids"], root), filepath.Join(h["memory"], root)
	const pidsMax, memMax = 40, 256 << 20
	write := func(path, v string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(v), 0); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(pidsDir, "pids.max"), strconv.Itoa(pidsMax))
	write(filepath.Join(memDir, "memory.limit_in_bytes"), strconv.Itoa(memMax))
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(pidsDir, "pids.max"), []byte("max"), 0)
		os.WriteFile(filepath.Join(memDir, "memory.limit_in_bytes"), []byte("-1"), 0)
	})
	a.createSandbox("cap")
	a.spawn("cap", wire.CreateSession{Argv: []string{"sh", "-c", "sleep 60 & sleep 60 & wait"}})
	read := func(path string) int64 {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A pod's holder is a task of the sandbox too (its threads), held
	// against the root's pids.max like the session's.
	holder := int64(holderTasks(t, filepath.Join(pidsDir, "cap")))
	var c wire.Capacity
	for range 100 { // until the session's three tasks are in place
		before := read(filepath.Join(pidsDir, "pids.current"))
		a.must("GET", "/v1/capacity", nil, 200, &c)
		if after := read(filepath.Join(pidsDir, "pids.current")); before == after && before == 3+holder {
			break
		}
	}
	if c.PIDsSource != wire.CapacityCgroup || c.PIDsFree != pidsMax-3-holder {
		t.Errorf("pids: got %d from %q, want %d from %q (pids.max %d less the session's 3 tasks and the pod holder's %d)", c.PIDsFree, c.PIDsSource, pidsMax-3-holder, wire.CapacityCgroup, pidsMax, holder)
	}
	used := read(filepath.Join(memDir, "memory.usage_in_bytes"))
	if c.MemorySource != wire.CapacityCgroup || c.MemoryAvailableBytes <= 0 || c.MemoryAvailableBytes > memMax || c.MemoryAvailableBytes < memMax-used-(8<<20) {
		t.Errorf("memory: got %d from %q, want about %d (limit %d less %d charged) from %q", c.MemoryAvailableBytes, c.MemorySource, memMax-used, memMax, used, wire.CapacityCgroup)
	}

	b := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, Cgroups: daemon.CgroupsOff})
	var hc wire.Capacity
	b.must("GET", "/v1/capacity", nil, 200, &hc)
	if hc.MemorySource != wire.CapacityHost || hc.PIDsSource != wire.CapacityHost || hc.PIDsFree <= pidsMax {
		t.Errorf("without cgroups: got memory from %q, %d pids from %q; want both from %q", hc.MemorySource, hc.PIDsFree, hc.PIDsSource, wire.CapacityHost)
	}
}
