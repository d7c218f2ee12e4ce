package daemon_test

import (
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// TestSessionRecordKeepsIncarnation: the session record carries its
// sandbox's incarnation (what the session routes check it against), read
// back from the registry file of a runnerd that was killed.
func TestSessionRecordKeepsIncarnation(t *testing.T) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	sb := a.createSandbox("increc")
	a.spawn("increc", wire.CreateSession{ID: "s1", Argv: []string{"sleep", "30"}})
	p.kill(syscall.SIGKILL)

	reg, err := registry.Open(filepath.Join(state, "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := reg.GetSession("increc", "s1")
	reg.Close()
	if err != nil {
		t.Fatal(err)
	}
	if ss.Incarnation != sb.Incarnation {
		t.Errorf("session record: got incarnation %q, want %q", ss.Incarnation, sb.Incarnation)
	}
	a, _ = startProcess(t, state)
	a.must("DELETE", "/v1/sandboxes/increc", nil, 204, nil)
}

// TestSessionRoutesCheckIncarnation: a session id reused in a re-created
// sandbox is not the old handle's: every session route called with the
// old incarnation is 404 not_found, and the new session is untouched.
func TestSessionRoutesCheckIncarnation(t *testing.T) {
	a := startDaemon(t)
	old := a.createSandbox("inc")
	a.spawn("inc", wire.CreateSession{ID: "s1", Argv: []string{"sleep", "30"}})
	a.must("DELETE", "/v1/sandboxes/inc", nil, 204, nil)
	cur := a.createSandbox("inc")
	if cur.Incarnation == old.Incarnation {
		t.Fatalf("re-created sandbox kept incarnation %s", old.Incarnation)
	}
	a.spawn("inc", wire.CreateSession{ID: "s1", Argv: []string{"cat"}})

	base := "/v1/sandboxes/inc/sessions/s1"
	stale := "?incarnation=" + old.Incarnation
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", base + stale, nil},
		{"POST", base + "/stdin" + stale, "from the old handle\n"},
		{"POST", base + "/close-stdin" + stale, nil},
		{"POST", base + "/signal" + stale, wire.Signal{Signal: "KILL"}},
		{"POST", base + "/terminate" + stale, wire.Terminate{GraceMS: 100}},
	} {
		r := a.do(c.method, c.path, c.body)
		if r.status != http.StatusNotFound || r.code() != wire.CodeNotFound {
			t.Errorf("%s %s: got %d %s, want 404 not_found", c.method, c.path, r.status, r.body)
		}
	}

	var got wire.Session
	a.must("GET", base+"?incarnation="+cur.Incarnation, nil, 200, &got)
	if got.State != wire.SessionRunning {
		t.Fatalf("new session: got state %s, want running", got.State)
	}
	// Its stdin got nothing from the old handle: what it echoes is ours.
	a.must("POST", base+"/stdin?incarnation="+cur.Incarnation, "new\n", 204, nil)
	a.must("POST", base+"/close-stdin?incarnation="+cur.Incarnation, nil, 204, nil)
	// cat ends at EOF by itself (a terminate could beat its echo).
	for deadline := time.Now().Add(20 * time.Second); got.State == wire.SessionRunning; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("cat did not exit at EOF")
		}
		a.must("GET", base, nil, 200, &got)
	}
	r := a.do("GET", "/v1/sandboxes/inc/sessions/s1/streams/stdout", nil)
	if string(r.body) != "new\n" {
		t.Fatalf("stdout: got %q, want %q", r.body, "new\n")
	}
}
