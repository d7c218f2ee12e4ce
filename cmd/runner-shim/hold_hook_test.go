package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSpawnHoldsTaskThroughHook: the task hold is a hook runner-shim
// passes to the supervisor (shim.Hooks), not code of the supervisor: a
// session spawned with --hold-task holds its task on the socket while the
// command runs (PUT before the command's end) and releases it after its
// exit record (DELETE once the command ended). Without the hook the
// socket hears nothing.
func TestSpawnHoldsTaskThroughHook(t *testing.T) {
	c := newCLI(t)
	dir, sock, got := tasksAPI(t)
	waitCalls := func(n int) []string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for len(got()) < n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		return got()
	}

	marker := filepath.Join(dir, "go")
	// Ends the command whatever happens below (before dir is removed).
	t.Cleanup(func() { os.WriteFile(marker, nil, 0o600); c.run("", "terminate", "h1") })
	if out, errOut, code := c.run("", "spawn", "--id", "h1", "--hold-task", sock, "--",
		"sh", "-c", "while [ ! -e "+marker+" ]; do sleep 0.01; done"); code != 0 {
		t.Fatalf("spawn: %d %q %q", code, out, errOut)
	}
	want := []string{`PUT sprite/v1/tasks/runner-shim-h1 {"expire":"120s"}`}
	if calls := waitCalls(1); strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("while the command runs: calls\n%s\nwant\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want = append(want, `DELETE sprite/v1/tasks/runner-shim-h1 `)
	if calls := waitCalls(2); strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after the command ended: calls\n%s\nwant\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
}
