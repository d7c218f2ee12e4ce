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
		WarmShims:   -1,
		ShimCommand: []string{"/bin/sh", "-c", "sleep " + delay + "; exec \"$0\" shim \"$@\"", runnerdBin}})
}

// TestSpawnUncertainKeepsRecord: a spawn whose shim did not report in
// time answers 503 uncertain and keeps the session's record and
// directory: the shim may still start the command, which must never run
// without a record.
func TestSpawnUncertainKeepsRecord(t *testing.T) {
	a := slowShimDaemon(t, "1.5")
	a.createSandbox("slow")
	marker := filepath.Join(t.TempDir(), "marker")
	req := wire.CreateSession{ID: "u1", Argv: []string{"sh", "-c", "echo x >> " + marker + "; exec sleep 30"}}
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
