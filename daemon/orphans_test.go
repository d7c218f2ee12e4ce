package daemon_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// sessionDirOf returns the directory under state/s whose spec.json names
// session id.
func sessionDirOf(t *testing.T, state, id string) string {
	t.Helper()
	specs, err := filepath.Glob(filepath.Join(state, "s", "*", sessiondir.SpecFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range specs {
		var spec sessiondir.Spec
		if b, err := os.ReadFile(p); err == nil && json.Unmarshal(b, &spec) == nil && spec.ID == id {
			return filepath.Dir(p)
		}
	}
	t.Fatalf("no session directory for %s among %v", id, specs)
	return ""
}

// orphanDir makes a session directory no record names, holding shim.pid
// with pid (none when 0), last changed at mtime.
func orphanDir(t *testing.T, state string, pid int, mtime time.Time) string {
	t.Helper()
	dir := filepath.Join(state, "s", registry.NewID())
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if pid != 0 {
		if err := os.WriteFile(filepath.Join(dir, sessiondir.PIDFile), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(dir, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestOrphanSessionDirsRemovedAtStart: at start, runnerd removes the
// session directories no record names once their shim is provably gone
// (a real finished session's whose record was lost, a synthetic one whose
// shim.pid names a dead process), and keeps one whose shim.pid names a
// live process, one young enough that a spawn may still be starting its
// shim, and every directory a record names.
func TestOrphanSessionDirsRemovedAtStart(t *testing.T) {
	state := t.TempDir()
	cfg := daemon.Config{StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff}
	a, stop := startDaemonStoppable(t, cfg)
	a.createSandbox("box")
	gone := a.spawn("box", wire.CreateSession{ID: "gone", Argv: []string{"true"}})
	kept := a.spawn("box", wire.CreateSession{ID: "kept", Argv: []string{"true"}})
	waitEnded(t, a, "box", gone.ID)
	waitEnded(t, a, "box", kept.ID)
	stop()

	goneDir, keptDir := sessionDirOf(t, state, gone.ID), sessionDirOf(t, state, kept.ID)
	for _, dir := range []string{goneDir, keptDir} {
		// Its shim exits once the command ended; wait for it, so only the
		// record decides.
		var sd struct {
			ShimPID int `json:"shim_pid"`
		}
		if b, err := os.ReadFile(filepath.Join(dir, sessiondir.StartedFile)); err != nil || json.Unmarshal(b, &sd) != nil || sd.ShimPID == 0 {
			t.Fatalf("%s: read shim pid: %v %+v", dir, err, sd)
		}
		if err := processGone(sd.ShimPID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// A crash between a delete's record and its directory.
	reg, err := registry.Open(filepath.Join(state, "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.DeleteSession("box", gone.ID); err != nil {
		t.Fatal(err)
	}
	reg.Close()

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	live := exec.Command("sleep", "30")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		live.Process.Kill()
		live.Wait()
	})
	old := time.Now().Add(-time.Hour)
	for _, dir := range []string{goneDir, keptDir} {
		if err := os.Chtimes(dir, old, old); err != nil {
			t.Fatal(err)
		}
	}
	deadDir := orphanDir(t, state, dead.Process.Pid, old)
	liveDir := orphanDir(t, state, live.Process.Pid, old)
	youngDir := orphanDir(t, state, 0, time.Now())

	a = startDaemonCfg(t, cfg)
	for _, c := range []struct {
		name string
		dir  string
		want bool
	}{
		{"finished session, record deleted", goneDir, false},
		{"shim.pid names a dead process", deadDir, false},
		{"shim.pid names a live process", liveDir, true},
		{"younger than the start timeout", youngDir, true},
		{"recorded session", keptDir, true},
	} {
		_, err := os.Stat(c.dir)
		if got := err == nil; got != c.want {
			t.Errorf("%s: directory exists %v (stat err %v), want %v", c.name, got, err, c.want)
		}
	}
	if !slices.Contains(sessionDirs(t, a), filepath.Base(keptDir)) {
		t.Errorf("recorded session's directory missing")
	}
	a.must("GET", "/v1/sandboxes/box/sessions/"+kept.ID, nil, 200, nil)
}
