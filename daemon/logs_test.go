package daemon_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// lockedBuffer is a log sink the daemon's goroutines write concurrently.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestLogsEndsResumesAndRefusals: a session's end and a sandbox's resume
// are logged at info, and each refused request (401, 400) is one line
// with method, route template and code, never the token, the body or the
// path's values.
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
		`msg="request refused" method=GET route="GET /v1/sandboxes/{name}" status=401 code=denied`,
		`msg="request refused" method=POST route="POST /v1/sandboxes/{name}/sessions" status=400 code=invalid`,
	} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("log has %d lines with %q, want 1", n, want)
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
