package daemon_test

import (
	"encoding/base64"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// An exec retried with the id of a session that never got its stdin closed
// (runnerd died between spawn and stdin) must close it, so the command
// cannot wait for input forever; and it must not send the bytes again.
func TestExecRetryClosesStdin(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("ex")
	// The first try's spawn, with no stdin step after it.
	var ss wire.Session
	a.must("POST", "/v1/sandboxes/ex/sessions", wire.CreateSession{ID: "turn-1", Argv: []string{"cat"}}, 201, &ss)
	var res wire.ExecResult
	a.must("POST", "/v1/sandboxes/ex/exec", wire.Exec{
		ID: "turn-1", Argv: []string{"cat"}, Stdin: []byte("not again"), TimeoutMS: 20000,
	}, 200, &res)
	if res.TimedOut {
		t.Fatalf("the retried exec timed out: its command never got EOF")
	}
	if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
		t.Errorf("exit %+v, want exited 0 (cat ends on EOF)", res.Exit)
	}
	if len(res.Stdout) != 0 {
		t.Errorf("stdout %q: the retry sent stdin again (%s), want nothing", res.Stdout, base64.StdEncoding.EncodeToString(res.Stdout))
	}
}
