package daemon_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// waitGlob waits up to within for a file matching pattern to exist.
func waitGlob(t *testing.T, pattern string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if m, _ := filepath.Glob(pattern); len(m) == 1 {
			return m[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", pattern, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stableStat returns path's size and mtime once they held for quiet (at
// most within): the registry's deferred commits have landed.
func stableStat(t *testing.T, path string, quiet, within time.Duration) os.FileInfo {
	t.Helper()
	deadline := time.Now().Add(within)
	last, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			t.Fatalf("%s still changing after %v", path, within)
		}
		time.Sleep(20 * time.Millisecond)
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != last.Size() || !fi.ModTime().Equal(last.ModTime()) {
			last, since = fi, time.Now()
		}
	}
	return last
}

// recordedSession opens the registry of a stopped runnerd and returns the
// session's record.
func recordedSession(t *testing.T, state, sandbox, id string) registry.Session {
	t.Helper()
	reg, err := registry.Open(filepath.Join(state, "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ss, err := reg.GetSession(sandbox, id)
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

// TestExitWhileRunnerdKilled: a session whose command ends while its
// runnerd is gone (killed with SIGKILL while the command still ran, so no
// runnerd saw the end) gets its exit recorded in the registry by the next
// runnerd's recovery (reconcile), before that runnerd serves and without
// any reader. Whoever comes to own exit recording (issue #37 item 1) must
// keep this.
func TestExitWhileRunnerdKilled(t *testing.T) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	// The mark is in the workspace, the one host directory a pod sees.
	release := filepath.Join(a.createSandbox("box").WorkspaceOnHost(), "release")
	a.spawn("box", wire.CreateSession{ID: "late", Argv: []string{"sh", "-c", "while [ ! -e release ]; do sleep 0.05; done; echo done; exit 5"}})
	// Let the deferred "running" commit land (the registry holds still),
	// then kill runnerd before the command ends.
	stableStat(t, filepath.Join(state, "registry.db"), 300*time.Millisecond, 10*time.Second)
	p.kill(syscall.SIGKILL)
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitGlob(t, filepath.Join(state, "s", "[^.]*", "journal", "exit.json"), 10*time.Second)
	if rec := recordedSession(t, state, "box", "late"); rec.Exit != nil {
		t.Fatalf("record %s exit %+v before any runnerd saw the end, want running", rec.State, rec.Exit)
	}

	_, p2 := startProcess(t, state)
	// Recovery records before runnerd serves; a clean stop, with no reader
	// having run, writes nothing more for the session. It waits for the
	// warm shims' staging directories, which a killed runnerd's remove
	// on their own.
	p2.kill(syscall.SIGTERM)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m, _ := filepath.Glob(filepath.Join(state, "s", ".warm-*")); len(m) == 0 {
			break
		}
	}
	rec := recordedSession(t, state, "box", "late")
	if rec.State != wire.SessionExited || rec.Exit == nil || rec.Exit.Code != 5 {
		t.Fatalf("record after restart: %s exit %+v, want exited code 5", rec.State, rec.Exit)
	}
}
