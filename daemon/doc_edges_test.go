package daemon_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestDeleteMalformedNameIsInvalid: "a malformed name is 400" wins over
// "DELETE of an absent name is 204": a name that can never exist is the
// caller's mistake, reported, not a silent success. A well-formed absent
// name (sandbox, session, incarnation) is 204.
func TestDeleteMalformedNameIsInvalid(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	for _, path := range []string{
		"/v1/sandboxes/Bad_Name",
		"/v1/sandboxes/-box",
		"/v1/sandboxes/box/sessions/-bad",
		"/v1/sandboxes/Bad_Name/sessions/s1",
		"/v1/sandboxes/nobox/sessions/-bad",
	} {
		a.wantError(a.do("DELETE", path, nil), 400, wire.CodeInvalid)
	}
	for _, path := range []string{
		"/v1/sandboxes/nobox",
		"/v1/sandboxes/nobox/sessions/s1",
		"/v1/sandboxes/box/sessions/s1",
		"/v1/sandboxes/box?incarnation=0000",
	} {
		if r := a.do("DELETE", path, nil); r.status != 204 {
			t.Errorf("DELETE %s: got %d %s, want 204", path, r.status, r.body)
		}
	}
}

// TestCloseStdinRepeat: a repeated close-stdin is 204 while the command
// runs and 409 command_exited once it has ended.
func TestCloseStdinRepeat(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	s := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "cat; sleep 60"}})
	path := "/v1/sandboxes/box/sessions/" + s.ID
	a.must("POST", path+"/close-stdin", nil, 204, nil)
	a.must("POST", path+"/close-stdin", nil, 204, nil)
	a.must("POST", path+"/terminate", `{"grace_ms":1000}`, 200, nil)
	a.wantError(a.do("POST", path+"/close-stdin", nil), 409, wire.CodeCommandExited)
}

// TestTokenFileEndsWithNewline: the generated token file is the token and
// one newline; a client strips it.
func TestTokenFileEndsWithNewline(t *testing.T) {
	state := t.TempDir()
	a := startDaemonCfg(t, daemon.Config{StateDir: state, NetPolicy: daemon.NetPolicyOff})
	raw, err := os.ReadFile(filepath.Join(state, "token"))
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := strings.CutSuffix(string(raw), "\n")
	if !ok || strings.ContainsAny(tok, "\r\n \t") || tok != a.token {
		t.Fatalf("token file %q: want the token and one newline", raw)
	}
}
