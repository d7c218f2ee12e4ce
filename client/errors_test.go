package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

const fakeToken = "sekrit-token-must-never-print-0123456789"

// runnerdError answers like runnerd: header and body.
func runnerdError(w http.ResponseWriter, status int, code wire.Code, retryMS int64) {
	w.Header().Set(wire.HeaderError, string(code))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"detail":"from the test","retry_after_ms":%d}}`, code, retryMS)
}

func newTestClient(t *testing.T, endpoint string) *client.Client {
	t.Helper()
	c, err := client.New(endpoint, fakeToken, client.Options{RequestTimeout: 500 * time.Millisecond, ConnectTimeout: 500 * time.Millisecond, HeartbeatTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestErrorMapping checks every answer shape against the taxonomy, with
// the one rule that matters most: only runnerd's own 404 not_found is
// definitive.
func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    adapter.Kind
	}{
		{"runnerd not_found", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 404, wire.CodeNotFound, 0) }, adapter.KindNotFound},
		{"plain 404 from another server", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, adapter.KindUnavailable},
		{"404 header not_found but a body that is not runnerd's", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(wire.HeaderError, "not_found")
			w.WriteHeader(404)
			w.Write([]byte("<html>not found</html>"))
		}, adapter.KindUnavailable},
		{"not_found header on a 500", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 500, wire.CodeNotFound, 0) }, adapter.KindUnavailable},
		{"404 no such route", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 404, wire.CodeInvalid, 0) }, adapter.KindInvalid},
		{"503 runnerd", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 503, wire.CodeUnavailable, 0) }, adapter.KindUnavailable},
		{"503 bare", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }, adapter.KindUnavailable},
		{"502 proxy", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) }, adapter.KindUnavailable},
		{"429", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 429, wire.CodeRateLimited, 1500) }, adapter.KindRateLimited},
		{"429 bare with Retry-After", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
		}, adapter.KindRateLimited},
		{"401", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 401, wire.CodeDenied, 0) }, adapter.KindDenied},
		{"403 bare", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(403) }, adapter.KindDenied},
		{"409 command_exited", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 409, wire.CodeCommandExited, 0) }, adapter.KindCommandExited},
		{"409 conflict", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 409, wire.CodeInvalid, 0) }, adapter.KindInvalid},
		{"416 truncated", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 416, wire.CodeTruncated, 0) }, adapter.KindTruncated},
		{"501 not_supported", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 501, wire.CodeNotSupported, 0) }, adapter.KindNotSupported},
		{"500 restore_failed", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 500, wire.CodeRestoreFailed, 0) }, adapter.KindRestoreFailed},
		{"507 write_failed", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 507, wire.CodeWriteFailed, 0) }, adapter.KindWriteFailed},
		{"500 provider", func(w http.ResponseWriter, r *http.Request) { runnerdError(w, 500, wire.CodeProvider, 0) }, adapter.KindProvider},
		{"200 that is not JSON", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>captive portal</html>")) }, adapter.KindUnavailable},
		{"200 cut mid-body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "200")
			w.Write([]byte(`{"name":"x","incarnation":"ab`))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}, adapter.KindUnavailable},
		{"hung server", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, adapter.KindUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestClient(t, serve(t, tc.handler))
			_, err := c.GetSandbox(context.Background(), "web-1")
			if got := adapter.KindOf(err); got != tc.want {
				t.Fatalf("GetSandbox = %v (kind %s), want kind %s", err, got, tc.want)
			}
			if tc.want != adapter.KindNotFound && errors.Is(err, adapter.ErrNotFound) {
				t.Fatalf("GetSandbox = %v: a non-definitive answer reads as not_found", err)
			}
			if tc.want == adapter.KindRateLimited {
				var rl *adapter.RateLimitedError
				if !errors.As(err, &rl) || rl.RetryAfter < time.Second {
					t.Errorf("GetSandbox = %v, want a RetryAfter of at least 1s", err)
				}
			}
			if strings.Contains(fmt.Sprintf("%v %+v %#v", err, err, err), fakeToken) {
				t.Errorf("error %v carries the token", err)
			}
		})
	}
}

func TestConnectionRefusedIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := newTestClient(t, "http://"+addr)
	_, err = c.GetSandbox(context.Background(), "web-1")
	if !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("GetSandbox against a closed port = %v, want unavailable", err)
	}
	_, err = c.Attach(context.Background(), "web-1", "s", client.Cursors{})
	if !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("Attach against a closed port = %v, want unavailable", err)
	}
	c2 := newTestClient(t, "unix:///nonexistent/runnerd.sock")
	if _, err := c2.Health(context.Background()); !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("Health on a missing socket = %v, want unavailable", err)
	}
}

func TestCallerContextIsAContextError(t *testing.T) {
	c := newTestClient(t, serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := c.GetSandbox(ctx, "web-1")
	if !errors.Is(err, context.Canceled) || errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("GetSandbox with a canceled context = %v, want context.Canceled", err)
	}
}

// attachServer answers an attach with the frames of send, then does end.
func attachServer(t *testing.T, send func(context.Context, *websocket.Conn)) string {
	return serve(t, func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		send(r.Context(), conn)
	})
}

func TestAttachTransportFailures(t *testing.T) {
	data, _ := wire.AppendData(nil, wire.StreamStdout, 0, []byte("hello\n"))
	tests := []struct {
		name string
		send func(context.Context, *websocket.Conn)
	}{
		{"closed 1001 without a terminal frame", func(ctx context.Context, c *websocket.Conn) {
			c.Write(ctx, websocket.MessageBinary, data)
			c.Close(websocket.StatusGoingAway, "bye")
		}},
		{"closed 1000 without a terminal frame", func(ctx context.Context, c *websocket.Conn) {
			c.Write(ctx, websocket.MessageBinary, data)
			c.Close(websocket.StatusNormalClosure, "")
		}},
		{"reset", func(ctx context.Context, c *websocket.Conn) {
			c.Write(ctx, websocket.MessageBinary, data)
		}},
		{"silent past the heartbeat timeout", func(ctx context.Context, c *websocket.Conn) {
			c.Write(ctx, websocket.MessageBinary, data)
			select {
			case <-ctx.Done():
			case <-time.After(3 * time.Second):
			}
		}},
		{"a gap in the stream", func(ctx context.Context, c *websocket.Conn) {
			c.Write(ctx, websocket.MessageBinary, data)
			gap, _ := wire.AppendData(nil, wire.StreamStdout, 7, []byte("lost a byte"))
			c.Write(ctx, websocket.MessageBinary, gap)
			time.Sleep(time.Second)
		}},
		{"an overlap in the stream", func(ctx context.Context, c *websocket.Conn) {
			c.Write(ctx, websocket.MessageBinary, data)
			again, _ := wire.AppendData(nil, wire.StreamStdout, 3, []byte("lo\nagain"))
			c.Write(ctx, websocket.MessageBinary, again)
			time.Sleep(time.Second)
		}},
		{"garbage message", func(ctx context.Context, c *websocket.Conn) {
			c.Write(ctx, websocket.MessageBinary, data)
			c.Write(ctx, websocket.MessageBinary, []byte("not a frame at all"))
			time.Sleep(time.Second)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestClient(t, attachServer(t, tc.send))
			fr, err := c.Attach(context.Background(), "web-1", "s1", client.Cursors{})
			if err != nil {
				t.Fatal(err)
			}
			defer fr.Close()
			f, err := fr.Next()
			if err != nil || f.Kind != wire.FrameData || string(f.Payload) != "hello\n" {
				t.Fatalf("first frame = %v %q, %v; want the data frame", f.Kind, f.Payload, err)
			}
			_, err = fr.Next()
			if !errors.Is(err, adapter.ErrUnavailable) {
				t.Fatalf("Next after a break = %v, want unavailable (a transport failure, never an exit)", err)
			}
		})
	}
}

// TestStreamCutIsOneTransportTerminal: through the Adapter, a connection
// cut without a terminal frame is exactly one terminal frame with
// *adapter.UnavailableError, then the channel closes.
func TestStreamCutIsOneTransportTerminal(t *testing.T) {
	data, _ := wire.AppendData(nil, wire.StreamStdout, 0, []byte("hello\n"))
	frames := attachFrames(t, attachAdapter(t, func(ctx context.Context, conn *websocket.Conn) {
		conn.Write(ctx, websocket.MessageBinary, data)
		conn.Close(websocket.StatusGoingAway, "")
	}))
	if len(frames) != 2 || frames[0].Offset != 0 || string(frames[0].Data) != "hello\n" {
		t.Fatalf("frames = %v, want the data frame and one terminal frame", frames)
	}
	last := frames[1]
	if last.Exit != nil || !errors.Is(last.Err, adapter.ErrUnavailable) {
		t.Fatalf("terminal frame = %v, want an unavailable error, never an exit", last)
	}
}

// TestExecErrorField: the body's exec_error reaches APIError.ExecError,
// with the invalid kind, so a caller can tell a missing command from a
// malformed request without reading the detail.
func TestExecErrorField(t *testing.T) {
	for _, want := range []wire.ExecError{wire.ExecErrorNotFound, wire.ExecErrorNotExecutable, ""} {
		t.Run(string(want)+"-", func(t *testing.T) {
			c := newTestClient(t, serve(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(wire.HeaderError, string(wire.CodeInvalid))
				w.WriteHeader(400)
				fmt.Fprintf(w, `{"error":{"code":"invalid","detail":"start command: x","exec_error":%q}}`, want)
			}))
			_, _, err := c.CreateSession(context.Background(), "web-1", wire.CreateSession{Argv: []string{"x"}})
			var api *client.APIError
			if !errors.As(err, &api) {
				t.Fatalf("CreateSession = %v, want an *APIError", err)
			}
			if api.ExecError != want || adapter.KindOf(err) != adapter.KindInvalid {
				t.Errorf("got exec_error %q kind %s, want %q invalid", api.ExecError, adapter.KindOf(err), want)
			}
		})
	}
}
