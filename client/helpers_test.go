package client_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// discovered is the client client.Discover finds from the environment,
// checked to be the daemon at endpoint; it is closed at t's cleanup.
func discovered(t *testing.T, endpoint string) *client.Client {
	t.Helper()
	l, err := client.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if l.Endpoint != endpoint {
		t.Fatalf("Discover: endpoint %s, want %s", l.Endpoint, endpoint)
	}
	c, err := l.New(client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// attachAdapter returns an Adapter whose runnerd knows one running
// sandbox, web-1 (incarnation i1), and answers every attach by handing
// the accepted WebSocket to attach (closed after it returns).
func attachAdapter(t *testing.T, attach func(ctx context.Context, conn *websocket.Conn)) *client.Adapter {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/capabilities", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"capabilities":["attach"]}`))
	})
	mux.HandleFunc("GET /v1/sandboxes/{name}", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"name":"web-1","incarnation":"i1","state":"running"}`))
	})
	mux.HandleFunc("GET /v1/sandboxes/{name}/sessions/{id}/attach", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		attach(r.Context(), conn)
	})
	c := newTestClient(t, serve(t, mux.ServeHTTP))
	a, err := client.NewAdapter(context.Background(), c, client.AdapterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// attachFrames attaches a to session s1 of web-1 and returns every frame
// the stream gives until its channel closes.
func attachFrames(t *testing.T, a *client.Adapter) []adapter.Frame {
	t.Helper()
	st, err := a.Attach(context.Background(), adapter.Handle{Provider: "runner", Name: "web-1", ID: "i1"}, "s1", adapter.Cursor{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var frames []adapter.Frame
	for f := range st.Frames() {
		frames = append(frames, f)
	}
	return frames
}
