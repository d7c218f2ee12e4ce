package daemon_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// TestListSessionsUnreadableSession: a session whose files cannot be read
// (its journal directory is replaced by a file, so even the listing's one
// stat fails) does not fail the listing: the list is 200 with every
// session, the broken one as last recorded and carrying status_error, the
// others without it.
func TestListSessionsUnreadableSession(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	a.spawn("box", wire.CreateSession{ID: "a-good", Argv: []string{"sleep", "30"}})
	a.spawn("box", wire.CreateSession{ID: "b-broken", Argv: []string{"sleep", "30"}})

	jdir := filepath.Join(sessionDirOf(t, a.state, "b-broken"), sessiondir.JournalDir)
	if err := os.Rename(jdir, jdir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jdir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Restored before Cleanup's destroy, which must read it to terminate.
	t.Cleanup(func() {
		os.Remove(jdir)
		os.Rename(jdir+".away", jdir)
	})

	var list wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &list)
	if len(list.Sessions) != 2 {
		t.Fatalf("got %d sessions, want 2: %+v", len(list.Sessions), list.Sessions)
	}
	good, broken := list.Sessions[0], list.Sessions[1]
	if good.ID != "a-good" || good.State != wire.SessionRunning || good.StatusError != "" {
		t.Errorf("good session: got id %s state %s status_error %q, want a-good running and none", good.ID, good.State, good.StatusError)
	}
	if broken.ID != "b-broken" || broken.State != wire.SessionRunning || broken.StatusError == "" {
		t.Errorf("broken session: got id %s state %s status_error %q, want b-broken running with a status_error", broken.ID, broken.State, broken.StatusError)
	}
	t.Logf("status_error: %s", broken.StatusError)

	// The single-session read still says it cannot answer.
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/b-broken", nil), 503, wire.CodeUnavailable)
}
