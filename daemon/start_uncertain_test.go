package daemon_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// slowShimDaemon is a daemon whose shims come up only after the spawn has
// given up waiting for them (a cold start delayed by a wrapper).
func slowShimDaemon(t *testing.T, delay string) *api {
	t.Helper()
	t.Cleanup(daemon.SetShimStartTimeout(500 * time.Millisecond))
	return startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		WarmShims: -1,
		// The wrapper returns at once and starts the shim in the
		// background, late, holding the readiness pipe meanwhile. A pod's
		// holder (the shim program's pod mode, started through the same
		// command) is started as is: the delay is the sessions'.
		ShimCommand: []string{"/bin/sh", "-c", "if [ \"$1\" = pod ]; then exec \"$0\" shim \"$@\"; fi; (sleep " + delay + "; exec \"$0\" shim \"$@\") & exit 0", runnerdBin}})
}

// TestSpawnUncertainKeepsRecord: a spawn whose shim did not report in
// time answers 503 uncertain and keeps the session's record and
// directory: the shim may still start the command, which must never run
// without a record.
func TestSpawnUncertainKeepsRecord(t *testing.T) {
	a := slowShimDaemon(t, "1.5")
	// The marker is in the workspace, the one host directory a pod sees.
	marker := filepath.Join(a.createSandbox("slow").WorkspaceOnHost(), "marker")
	req := wire.CreateSession{ID: "u1", Argv: []string{"sh", "-c", "echo x >> marker; exec sleep 30"}}
	r := a.do("POST", "/v1/sandboxes/slow/sessions", req)
	a.wantError(r, http.StatusServiceUnavailable, wire.CodeUnavailable)
	if d := r.errBody(t).Detail; !strings.HasPrefix(d, wire.DetailUncertain) {
		t.Errorf("detail %q, want it to start with %q", d, wire.DetailUncertain)
	}
	// The record is still there while the command comes up.
	a.must("GET", "/v1/sandboxes/slow/sessions/u1", nil, 200, nil)
	waitFile(t, marker)
	a.must("GET", "/v1/sandboxes/slow/sessions/u1", nil, 200, nil)
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStartingSessionResolves: a session left starting is never treated
// as stopped (a destroy while it comes up is 503 uncertain and removes
// nothing), a retry of its id attaches to the command that came up (one
// process, never two), and the destroy then stops it.
func TestStartingSessionResolves(t *testing.T) {
	a := slowShimDaemon(t, "2")
	marker := filepath.Join(a.createSandbox("slow").WorkspaceOnHost(), "marker")
	req := wire.CreateSession{ID: "u2", Argv: []string{"sh", "-c", "echo x >> marker; exec sleep 30"}}
	a.wantError(a.do("POST", "/v1/sandboxes/slow/sessions", req), http.StatusServiceUnavailable, wire.CodeUnavailable)
	a.wantError(a.do("DELETE", "/v1/sandboxes/slow", nil), http.StatusServiceUnavailable, wire.CodeUnavailable)
	a.must("GET", "/v1/sandboxes/slow", nil, 200, nil)

	var ss wire.Session
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := a.do("POST", "/v1/sandboxes/slow/sessions", req)
		if r.status == http.StatusOK {
			if err := jsonUnmarshal(r.body, &ss); err != nil {
				t.Fatal(err)
			}
			break
		}
		a.wantError(r, http.StatusServiceUnavailable, wire.CodeUnavailable)
		if time.Now().After(deadline) {
			t.Fatalf("retry never attached: %d %s", r.status, r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ss.State != wire.SessionRunning || ss.PID <= 0 {
		t.Fatalf("retry: got state %s pid %d, want running with a pid", ss.State, ss.PID)
	}
	time.Sleep(300 * time.Millisecond)
	if b, _ := os.ReadFile(marker); string(b) != "x\n" {
		t.Fatalf("marker %q: want exactly one start", b)
	}
	a.must("DELETE", "/v1/sandboxes/slow", nil, 204, nil)
	if err := processGone(ss.PID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
