package daemon_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

func TestPreviewURL(t *testing.T) {
	// The sandbox's app: a server on a loopback port.
	app, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	appSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "app saw %s", r.URL.Path)
	})}
	go appSrv.Serve(app)
	t.Cleanup(func() { appSrv.Close() })

	previewAddr := freeLoopback(t)
	_, previewPort, _ := net.SplitHostPort(previewAddr)

	state := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	errc := make(chan error, 1)
	cgRoot := testCgroupRoot(t)
	go func() {
		errc <- daemon.Run(ctx, daemon.Config{
			StateDir: state, Socket: "none", Token: testToken, TCPListener: l, CgroupRoot: cgRoot,
			NetPolicy:          daemon.NetPolicyOff,
			ShimCommand:        []string{runnerdBin, "shim"},
			PreviewListen:      previewAddr,
			PreviewURLTemplate: "http://{token}.localhost:" + previewPort + "/",
			Ready:              func(string) { close(ready) },
			Logger:             testLogger(t),
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		cancel()
		t.Fatal(err)
	}
	a := &api{t: t, base: "http://" + l.Addr().String(), hc: &http.Client{Timeout: 30 * time.Second}, token: testToken, state: state}
	t.Cleanup(func() {
		a.destroyAll()
		cancel()
		<-errc
	})
	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	if !slices.Contains(caps.Capabilities, wire.CapPublicURL) {
		t.Errorf("capabilities %v lack public_url", caps.Capabilities)
	}
	a.createSandbox("web")
	_, appPort, _ := net.SplitHostPort(app.Addr().String())
	var u wire.URL
	a.must("POST", "/v1/sandboxes/web/urls", `{"port":`+appPort+`}`, 200, &u)
	var again wire.URL
	a.must("POST", "/v1/sandboxes/web/urls", `{"port":`+appPort+`}`, 200, &again)
	if again.URL != u.URL {
		t.Errorf("second URL %q, want %q", again.URL, u.URL)
	}
	a.wantError(a.do("POST", "/v1/sandboxes/web/urls", `{"port":0}`), 400, wire.CodeInvalid)

	// A browser with no credential: dial the preview listener with the
	// URL's Host.
	get := func() (int, string) {
		parsed, err := url.Parse(u.URL)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://"+previewAddr+"/hello", nil)
		req.Host = parsed.Host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(); status != 200 || body != "app saw /hello" {
		t.Errorf("preview: %d %q", status, body)
	}

	// runnerd's own ports are not the sandbox's: a URL for the preview
	// listener would loop, one for the API would expose it.
	_, apiPort, _ := net.SplitHostPort(l.Addr().String())
	for _, port := range []string{previewPort, apiPort} {
		a.wantError(a.do("POST", "/v1/sandboxes/web/urls", `{"port":`+port+`}`), 400, wire.CodeInvalid)
	}

	// Parked: nothing of the sandbox serves, but the preview is not gone.
	a.must("POST", "/v1/sandboxes/web/suspend", nil, 200, nil)
	if status, _ := get(); status != 503 {
		t.Errorf("preview of a suspended sandbox: %d, want 503 (unavailable, never 404)", status)
	}
	a.must("POST", "/v1/sandboxes/web/resume", nil, 200, nil)
	if status, body := get(); status != 200 || body != "app saw /hello" {
		t.Errorf("preview after resume: %d %q", status, body)
	}
	a.must("DELETE", "/v1/sandboxes/web", nil, 204, nil)
	if status, _ := get(); status != 404 {
		t.Errorf("preview after destroy: %d, want 404", status)
	}
}
