package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// sessionDirs returns the session directories under the state directory.
func sessionDirs(t *testing.T, a *api) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(a.state, "s"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// waitEnded waits until the session's record says it ended.
func waitEnded(t *testing.T, a *api, sandbox, id string) wire.Session {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var s wire.Session
		a.must("GET", "/v1/sandboxes/"+sandbox+"/sessions/"+id, nil, 200, &s)
		if s.State != wire.SessionRunning {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: still running", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeleteSession: an ended session's record and directory go, a second
// delete (and one of a session that never existed) is 204; a running
// session is refused 409 invalid and keeps running; the incarnation
// parameter scopes the delete.
func TestDeleteSession(t *testing.T) {
	a := startDaemon(t)
	sb := a.createSandbox("box")
	done := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "echo bye"}})
	live := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "30"}})
	waitEnded(t, a, "box", done.ID)
	if got := len(sessionDirs(t, a)); got != 2 {
		t.Fatalf("session directories before the delete: got %d, want 2", got)
	}

	// Another incarnation's delete touches nothing.
	a.must("DELETE", "/v1/sandboxes/box/sessions/"+done.ID+"?incarnation=0000000000000000", nil, 204, nil)
	a.must("GET", "/v1/sandboxes/box/sessions/"+done.ID, nil, 200, nil)

	a.must("DELETE", "/v1/sandboxes/box/sessions/"+done.ID+"?incarnation="+sb.Incarnation, nil, 204, nil)
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/"+done.ID, nil), 404, wire.CodeNotFound)
	if got := len(sessionDirs(t, a)); got != 1 {
		t.Fatalf("session directories after the delete: got %d, want 1", got)
	}
	a.must("DELETE", "/v1/sandboxes/box/sessions/"+done.ID, nil, 204, nil)
	a.must("DELETE", "/v1/sandboxes/box/sessions/never", nil, 204, nil)
	a.must("DELETE", "/v1/sandboxes/nobox/sessions/never", nil, 204, nil)

	r := a.do("DELETE", "/v1/sandboxes/box/sessions/"+live.ID, nil)
	a.wantError(r, 409, wire.CodeInvalid)
	if d := r.errBody(t).Detail; !strings.Contains(d, "terminate it first") {
		t.Errorf("detail %q: want it to say terminate it first", d)
	}
	var s wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/"+live.ID, nil, 200, &s)
	if s.State != wire.SessionRunning {
		t.Fatalf("after a refused delete: got state %s, want running", s.State)
	}
	a.must("POST", "/v1/sandboxes/box/sessions/"+live.ID+"/terminate", wire.Terminate{GraceMS: 1000}, 200, nil)
	a.must("DELETE", "/v1/sandboxes/box/sessions/"+live.ID, nil, 204, nil)
	if got := len(sessionDirs(t, a)); got != 0 {
		t.Fatalf("session directories at the end: got %d, want 0", got)
	}
}

// TestDeleteSessionLingering: a session whose command ended but left a
// process behind (its shim still lives) is refused until terminated.
func TestDeleteSessionLingering(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	ss := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "setsid sleep 30 >/dev/null 2>&1 </dev/null & exit 0"}})
	waitEnded(t, a, "box", ss.ID)
	a.wantError(a.do("DELETE", "/v1/sandboxes/box/sessions/"+ss.ID, nil), 409, wire.CodeInvalid)
	a.must("POST", "/v1/sandboxes/box/sessions/"+ss.ID+"/terminate", wire.Terminate{GraceMS: 1000}, 200, nil)
	a.must("DELETE", "/v1/sandboxes/box/sessions/"+ss.ID, nil, 204, nil)
}

