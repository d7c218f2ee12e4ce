package daemon_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// leafExists reports whether session id's leaf of sandbox sb exists in
// any of the memory, pids and cpu hierarchies.
func leafExists(root, sb, id string) bool {
	for _, c := range []string{"memory", "pids", "cpu"} {
		if _, err := os.Stat(filepath.Join(sbCgroup(root, c, sb), id)); err == nil {
			return true
		}
	}
	return false
}

// TestSessionLeafReleasedAfterExit (#34 finding 6): an ended session's
// cgroup leaf goes shortly after its exit, while its record and journal
// stay until the session is deleted; a leaf that still holds a process
// (a background job the command left, a running command) stays and
// nothing in it is killed; a v1 OOM kill counted in a released leaf is
// still in the sandbox's usage.
func TestSessionLeafReleasedAfterExit(t *testing.T) {
	defer daemon.SetLeafSweepInterval(100 * time.Millisecond)()
	a, root := limitsDaemon(t)
	a.createLimited("box", wire.Limits{MemoryBytes: smallMemory})

	gone := func(id string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for leafExists(root, "box", id) {
			if time.Now().After(deadline) {
				t.Fatalf("leaf of ended session %s still exists 10s after its exit", id)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ended := a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "echo done"}, TimeoutMS: 20000})
	if ended.Exit.Code != 0 {
		t.Fatalf("exec: %+v", ended.Exit)
	}
	gone(ended.Session)
	var ss wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/"+ended.Session, nil, 200, &ss)
	if ss.Exit == nil || ss.Exit.Code != 0 {
		t.Fatalf("session after its leaf went: %+v, want its exit kept", ss)
	}
	if got := a.attach(t.Context(), "box", ended.Session, "", nil); string(got.streams["stdout"]) != "done\n" {
		t.Fatalf("journal after its leaf went: %q", got.streams["stdout"])
	}

	running := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	left := a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"}, TimeoutMS: 20000})
	if left.Exit.Code != 0 {
		t.Fatalf("exec: %+v", left.Exit)
	}
	hog := a.exec("box", wire.Exec{Argv: []string{"tail", "/dev/zero"}, TimeoutMS: 60000})
	if !hog.Exit.OOMKilled {
		t.Fatalf("hog: %+v, want oom_killed", hog.Exit)
	}
	gone(hog.Session)
	time.Sleep(500 * time.Millisecond) // several sweeps
	for _, id := range []string{running.ID, left.Session} {
		if !leafExists(root, "box", id) {
			t.Fatalf("leaf of session %s, which holds a process, was removed", id)
		}
	}
	if err := syscall.Kill(running.PID, 0); err != nil {
		t.Fatalf("the running command %d was killed", running.PID)
	}
	var sb wire.Sandbox
	a.must("GET", "/v1/sandboxes/box", nil, 200, &sb)
	if sb.Usage == nil || sb.Usage.OOMKills != 1 {
		t.Fatalf("usage after the hog's leaf went: %+v, want oom_kills 1", sb.Usage)
	}
}
