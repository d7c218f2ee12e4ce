package daemon_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestPreviewURLNeedsListener: url-or-nothing. No URL is minted for a port
// nothing listens on (409 invalid, never not_found), nor for a listener
// the proxy cannot reach (another address); once something listens the
// URL comes, and when the listener goes away the URL answers 502.
func TestPreviewURLNeedsListener(t *testing.T) {
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	previewAddr := pl.Addr().String()
	pl.Close()
	_, previewPort, _ := net.SplitHostPort(previewAddr)
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		PreviewListen: previewAddr, PreviewURLTemplate: "http://{token}.localhost:" + previewPort + "/"})
	a.createSandbox("web")

	// A free port: bound and released.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	body := fmt.Sprintf(`{"port":%d}`, port)

	r := a.do("POST", "/v1/sandboxes/web/urls", body)
	a.wantError(r, 409, wire.CodeInvalid)
	if got, want := r.errBody(t).Detail, fmt.Sprintf("nothing listens on port %d in sandbox web", port); got != want {
		t.Errorf("detail %q, want %q", got, want)
	}
	// On an address the proxy does not dial (it dials 127.0.0.1).
	if other, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port)); err == nil {
		a.wantError(a.do("POST", "/v1/sandboxes/web/urls", body), 409, wire.CodeInvalid)
		other.Close()
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
	var u wire.URL
	a.must("POST", "/v1/sandboxes/web/urls", body, 200, &u)
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
