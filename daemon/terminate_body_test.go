package daemon_test

import (
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestTerminateGraceBody: grace_ms absent, 0, or an empty body mean the
// default grace (what every Go client has sent for "default"); anything
// else outside 1..30000, or not a number, is 400 invalid.
func TestTerminateGraceBody(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	for _, body := range []string{"", "{}", `{"grace_ms":0}`, `{"grace_ms":1}`, `{"grace_ms":30000}`} {
		s := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
		var e wire.Exit
		a.must("POST", "/v1/sandboxes/box/sessions/"+s.ID+"/terminate", body, 200, &e)
		if !e.Terminated || e.Reason != wire.ExitSignaled || e.Signal != 15 {
			t.Errorf("body %q: got exit %+v, want signaled by TERM, terminated", body, e)
		}
	}
	s := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	for _, body := range []string{`{"grace_ms":-1}`, `{"grace_ms":30001}`, `{"grace_ms":"1"}`, `{"grace_ms":1.5}`} {
		a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/"+s.ID+"/terminate", body), 400, wire.CodeInvalid)
	}
}
