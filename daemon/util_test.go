package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func processGone(pid int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("process %d still alive after %v", pid, within)
}

func dialAttach(t *testing.T, ctx context.Context, a *api, sandbox, id string) *websocket.Conn {
	t.Helper()
	conn, _, err := websocket.Dial(ctx, strings.Replace(a.base, "http", "ws", 1)+"/v1/sandboxes/"+sandbox+"/sessions/"+id+"/attach",
		&websocket.DialOptions{HTTPClient: a.hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + a.token}}})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
