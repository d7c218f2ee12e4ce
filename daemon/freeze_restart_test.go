package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestKilledWhileFrozenThawedAtRestart: a runnerd SIGKILLed while a
// checkpoint held its sandbox frozen never thaws it; the runnerd that
// starts next does (adopting the cgroup), so the sandbox's commands run
// again and a pod's holder can be ended. Played by freezing the cgroup by
// hand and killing runnerd.
func TestKilledWhileFrozenThawedAtRestart(t *testing.T) {
	needV1Cgroups(t)
	h := cgroupHierarchies()
	if h["freezer"] == "" {
		t.Skip("SKIP: no cgroup v1 freezer hierarchy (the cgroup package tests v2's cgroup.freeze)")
	}
	state := t.TempDir()
	a, p := startProcess(t, state)
	a.createSandbox("frz")
	if got := a.run("frz", "echo", "before"); got != "before" {
		t.Fatalf("before the freeze: %q", got)
	}
	stateFile := filepath.Join(h["freezer"], stateCgroupRoot(t, state), "frz", "freezer.state")
	if err := os.WriteFile(stateFile, []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	p.kill(syscall.SIGKILL)
	a2, _ := startProcess(t, state)
	if got := a2.run("frz", "echo", "after"); got != "after" {
		t.Errorf("after the restart: %q", got)
	}
	if b, err := os.ReadFile(stateFile); err != nil || strings.TrimSpace(string(b)) != "THAWED" {
		t.Errorf("freezer.state after the restart: %q %v, want THAWED", b, err)
	}
}
