package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestAttachClosesGoingAwayOnStop: when runnerd stops, an attach to a
// running session ends with a close frame of status 1001 (going away) and
// no terminal frame, as docs/protocol.md promises, not a dropped TCP
// connection (1006), which a client cannot tell from a network failure.
func TestAttachClosesGoingAwayOnStop(t *testing.T) {
	a, stop := startDaemonStoppable(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff})
	a.createSandbox("box")
	// It outlives the stopped daemon (shims are detached) and ends by
	// itself soon after, so nothing is left behind.
	a.spawn("box", wire.CreateSession{ID: "s1", Argv: []string{"sh", "-c", "echo hi; exec sleep 6"}})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, strings.Replace(a.base, "http", "ws", 1)+"/v1/sandboxes/box/sessions/s1/attach",
		&websocket.DialOptions{HTTPClient: a.hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + a.token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	// The first data frame: the attach is serving.
	if _, msg, err := conn.Read(ctx); err != nil {
		t.Fatal(err)
	} else if f, err := wire.ParseFrame(msg); err != nil || f.Kind != wire.FrameData {
		t.Fatalf("first frame %v (%v), want data", f.Kind, err)
	}
	go stop()
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("attach ended with %v, want a close frame with status 1001", err)
			}
			if ce.Code != websocket.StatusGoingAway {
				t.Fatalf("close status %d (%q), want 1001", ce.Code, ce.Reason)
			}
			return
		}
		f, err := wire.ParseFrame(msg)
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind != wire.FrameHeartbeat && f.Kind != wire.FrameData {
			t.Fatalf("got a %v frame while runnerd stopped, want none before the close", f.Kind)
		}
	}
}
