package daemon_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestPreviewURLBeforeListener: url-or-nothing. A port nothing listens on
// yet gets its URL with listening false (and so does a listener the proxy
// cannot reach: another address); the URL answers a 502 page, at once,
// until something listens, then the page; asking again returns the same
// URL with listening true; when the listener goes away the URL answers 502
// again.
func TestPreviewURLBeforeListener(t *testing.T) {
	previewAddr := freeLoopback(t)
	_, previewPort, _ := net.SplitHostPort(previewAddr)
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		PreviewListen: previewAddr, PreviewURLTemplate: "http://{token}.localhost:" + previewPort + "/"})
	a.createSandbox("web")

	// A free port: bound and released.
	_, freePort, _ := net.SplitHostPort(freeLoopback(t))
	port, _ := strconv.Atoi(freePort)
	body := fmt.Sprintf(`{"port":%d}`, port)

	var u wire.URL
	a.must("POST", "/v1/sandboxes/web/urls", body, 200, &u)
	if u.URL == "" || u.Listening == nil || *u.Listening {
		t.Fatalf("URL of a port nothing listens on: %+v, want a URL with listening false", u)
	}
	// On an address the proxy does not dial (127.0.0.1, ::1).
	if other, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port)); err == nil {
		var again wire.URL
		a.must("POST", "/v1/sandboxes/web/urls", body, 200, &again)
		if again.URL != u.URL || again.Listening == nil || *again.Listening {
			t.Errorf("URL with a listener on 127.0.0.2: %+v, want %s with listening false", again, u.URL)
		}
		other.Close()
	}

	get := func() (int, string) {
		parsed, err := url.Parse(u.URL)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://"+previewAddr+"/", nil)
		req.Host = parsed.Host
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get(wire.HeaderError)
	}
	start := time.Now()
	if status, code := get(); status != http.StatusBadGateway || code != string(wire.CodeUnavailable) {
		t.Errorf("preview before a listener: %d %s %q, want 502 with %s: unavailable", status, wire.HeaderError, code, wire.HeaderError)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("preview before a listener took %v: a refused port must be answered at once", took)
	}

	app, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(app)
	}()
	var listening wire.URL
	a.must("POST", "/v1/sandboxes/web/urls", body, 200, &listening)
	if listening.URL != u.URL || listening.Listening == nil || !*listening.Listening {
		t.Errorf("URL once something listens: %+v, want %s with listening true", listening, u.URL)
	}
	if status, _ := get(); status != 200 {
		t.Fatalf("preview with a listener: %d, want 200", status)
	}
	// The listener goes away: the URL stays valid and answers 502.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	<-served
	if status, code := get(); status != http.StatusBadGateway || code != string(wire.CodeUnavailable) {
		t.Errorf("preview after the listener closed: %d %s %q, want 502 with %s: unavailable", status, wire.HeaderError, code, wire.HeaderError)
	}
}
