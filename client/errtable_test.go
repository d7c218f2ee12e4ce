package client_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// frameAdapter returns an Adapter whose runnerd answers every attach with
// the frames of payloads, one WebSocket message each.
func frameAdapter(t *testing.T, payloads ...[]byte) *client.Adapter {
	t.Helper()
	return attachAdapter(t, func(ctx context.Context, conn *websocket.Conn) {
		for _, p := range payloads {
			if err := conn.Write(ctx, websocket.MessageBinary, p); err != nil {
				return
			}
		}
		conn.Close(websocket.StatusNormalClosure, "")
	})
}

// TestErrorFrameKinds: an error frame of every code reads as its own kind
// through the Adapter, and only rate_limited and unavailable are
// transient. Before the one error table, not_supported, command_exited and
// restore_failed frames fell through to unavailable and read as
// retryable. not_found inside a stream is never definitive.
func TestErrorFrameKinds(t *testing.T) {
	for _, code := range wire.Codes {
		t.Run(string(code), func(t *testing.T) {
			b, err := wire.AppendError(nil, wire.Error{Code: code, Detail: "from the test"})
			if err != nil {
				t.Fatal(err)
			}
			frames := attachFrames(t, frameAdapter(t, b))
			if len(frames) != 1 || frames[0].Exit != nil || frames[0].Err == nil {
				t.Fatalf("frames = %v, want one terminal error frame", frames)
			}
			want := adapter.Kind(code)
			if code == wire.CodeNotFound {
				want = adapter.KindUnavailable
			}
			row, _ := wire.RowOf(code)
			if got := adapter.KindOf(frames[0].Err); got != want {
				t.Errorf("error frame %s reads as %s (%v), want %s", code, got, frames[0].Err, want)
			}
			if got := adapter.Transient(frames[0].Err); got != (row.Transient || code == wire.CodeNotFound) {
				t.Errorf("error frame %s: Transient = %v, want %v", code, got, row.Transient)
			}
		})
	}
}

// TestUncertainAnswer: an unavailable answer that says its outcome is
// unknown is *adapter.UnavailableError with Uncertain set, whether runnerd
// sent the structured field or (an older daemon) only the detail prefix.
func TestUncertainAnswer(t *testing.T) {
	tests := []struct {
		name string
		body string
		want bool
	}{
		{"field", `{"error":{"code":"unavailable","detail":"session s1 is still starting; retry","uncertain":true}}`, true},
		{"old detail prefix", `{"error":{"code":"unavailable","detail":"uncertain: session s1 is still starting; retry"}}`, true},
		{"plain unavailable", `{"error":{"code":"unavailable","detail":"runnerd is stopping"}}`, false},
		{"the word elsewhere", `{"error":{"code":"unavailable","detail":"journal: uncertainty"}}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestClient(t, serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(wire.HeaderError, string(wire.CodeUnavailable))
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(tc.body))
			}))
			_, err := c.Terminate(context.Background(), "web-1", "s1", 0)
			var ue *adapter.UnavailableError
			if !errors.As(err, &ue) {
				t.Fatalf("Terminate = %v, want *adapter.UnavailableError", err)
			}
			if ue.Uncertain != tc.want {
				t.Errorf("Uncertain = %v, want %v (err %v)", ue.Uncertain, tc.want, err)
			}
			var api *client.APIError
			if !errors.As(err, &api) || api.Uncertain != tc.want {
				t.Errorf("APIError = %+v, want Uncertain %v", api, tc.want)
			}
		})
	}
}
