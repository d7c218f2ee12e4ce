package daemon_test

import (
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/logsink"
	"github.com/agentrunner/runner/wire"
)

// lockedBuffer is a log sink the daemon's goroutines write concurrently.
type lockedBuffer = logsink.Buffer

// TestLogsEndsResumesAndRefusals: a session's end and a sandbox's resume
// are logged at info, and each refused request (401, 400) is one line
// with its request id, method, route template, code and redacted reason,
// never the token or the body.
func TestLogsEndsResumesAndRefusals(t *testing.T) {
	var logs lockedBuffer
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	a.createSandbox("box")
	a.exec("box", wire.Exec{ID: "e1", Argv: []string{"sh", "-c", "exit 3"}})
	a.must("POST", "/v1/sandboxes/box/suspend", nil, 200, nil)
	a.must("POST", "/v1/sandboxes/box/resume", nil, 200, nil)

	good := a.token
	a.token = "wrong-token-SECRET1"
	a.wantError(a.do("GET", "/v1/sandboxes/box", nil), 401, wire.CodeDenied)
	a.token = good
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions", `{"argv":["true"],"env":["NOEQUALS-SECRET2"]}`), 400, wire.CodeInvalid)

	out := logs.String()
	for _, want := range []string{
		`msg="session ended" sandbox=box session=e1 reason=exited code=3`,
		`msg="sandbox resumed" sandbox=box`,
	} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("log has %d lines with %q, want 1", n, want)
		}
	}
	for _, want := range []string{
		`msg="request refused" request_id=[0-9a-f]{16} method=GET route="GET /v1/sandboxes/\{name\}" status=401 duration_ms=[0-9.]+ code=denied reason="missing or wrong bearer token"\n`,
		`msg="request refused" request_id=[0-9a-f]{16} method=POST route="POST /v1/sandboxes/\{name\}/sessions" sandbox=box status=400 duration_ms=[0-9.]+ code=invalid reason=`,
	} {
		if n := len(regexp.MustCompile(want).FindAllString(out, -1)); n != 1 {
			t.Errorf("log has %d lines matching %q, want 1", n, want)
		}
	}
	for _, secret := range []string{"SECRET1", "SECRET2", testToken} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q:\n%s", secret, out)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}
