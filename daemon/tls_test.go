package daemon_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/testpki"
	"github.com/agentrunner/runner/wire"
)

// tlsDaemon starts a daemon whose API listener speaks TLS with a server
// certificate of ca (and, with clientCA, requires client certificates of
// it), and returns an api that speaks https with cert as its client
// certificate (nil: none).
func tlsDaemon(t *testing.T, ca *testpki.CA, server testpki.Pair, clientCA string, cert *tls.Certificate) *api {
	t.Helper()
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		TLSCert: server.CertFile, TLSKey: server.KeyFile, TLSClientCA: clientCA})
	a.base = strings.Replace(a.base, "http://", "https://", 1)
	a.hc = tlsHTTPClient(ca.Pool(), cert)
	return a
}

func tlsHTTPClient(roots *x509.CertPool, cert *tls.Certificate) *http.Client {
	conf := &tls.Config{RootCAs: roots}
	if cert != nil {
		conf.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
}

// peerSerial dials addr over TLS and returns the serial of the server's
// certificate.
func peerSerial(t *testing.T, addr string, roots *x509.CertPool, conf *tls.Config) string {
	t.Helper()
	if conf == nil {
		conf = &tls.Config{RootCAs: roots}
	}
	c, err := tls.Dial("tcp", addr, conf)
	if err != nil {
		t.Fatalf("tls dial %s: %v", addr, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestTLSHandshake: the API listener speaks TLS 1.2 or later with the
// configured certificate, answers the API over it, refuses TLS 1.1, and
// a plain HTTP request gets no answer at all (the token is never read in
// clear).
func TestTLSHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	srv := ca.Server(t, "runnerd")
	a := tlsDaemon(t, ca, srv, "", nil)
	addr := strings.TrimPrefix(a.base, "https://")

	if got, want := peerSerial(t, addr, ca.Pool(), nil), srv.Serial.String(); got != want {
		t.Fatalf("server certificate serial: got %s, want %s", got, want)
	}
	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	if r := a.do("GET", "/v1/capabilities", nil); r.status != 200 {
		t.Fatalf("GET /v1/capabilities over TLS: got %d, want 200", r.status)
	}
	a.token = "wrong"
	a.wantError(a.do("GET", "/v1/capabilities", nil), 401, wire.CodeDenied)
	a.token = testToken

	_, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), MaxVersion: tls.VersionTLS11})
	if err == nil {
		t.Fatal("a TLS 1.1 handshake succeeded, want it refused")
	}

	// Plain HTTP to the TLS port: no HTTP answer (the server sees a bad
	// handshake and closes).
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/healthz")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("plain HTTP to the TLS listener: got status %d, want no HTTP answer", resp.StatusCode)
	}

	// The listen file says TLS, so a client dials https.
	raw := readListenFile(t, a.state)
	if !raw.TLS || raw.TCP != addr {
		t.Fatalf("listen file: got %+v, want tcp %s with tls", raw, addr)
	}
}

// TestMTLS: with a client CA, a client without a certificate, or with one
// of another CA, fails the handshake; one with a good certificate still
// needs the bearer token (the documented decision); with both, it is
// served.
func TestMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	other := testpki.NewCA(t, dir, "other")
	srv := ca.Server(t, "runnerd")
	good := ca.Client(t, "control-plane")
	stranger := other.Client(t, "stranger")
	a := tlsDaemon(t, ca, srv, ca.CertFile, &good.TLS)
	addr := strings.TrimPrefix(a.base, "https://")

	for _, tc := range []struct {
		name string
		cert *tls.Certificate
	}{
		{"no client certificate", nil},
		{"a certificate of another CA", &stranger.TLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc := tlsHTTPClient(ca.Pool(), tc.cert)
			req, _ := http.NewRequest("GET", a.base+"/v1/capabilities", nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("got status %d, want the handshake refused", resp.StatusCode)
			}
			var alert tls.AlertError
			var opErr *net.OpError
			if !errors.As(err, &alert) && !errors.As(err, &opErr) {
				t.Fatalf("got %v, want a TLS alert or a closed connection", err)
			}
		})
	}
	t.Run("a good certificate without the token", func(t *testing.T) {
		b := *a
		b.token = ""
		b.wantError(b.do("GET", "/v1/capabilities", nil), 401, wire.CodeDenied)
	})
	t.Run("a good certificate and the token", func(t *testing.T) {
		if r := a.do("GET", "/v1/capabilities", nil); r.status != 200 {
			t.Fatalf("got %d %s, want 200", r.status, r.body)
		}
		if got := peerSerial(t, addr, nil, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{good.TLS}}); got != srv.Serial.String() {
			t.Fatalf("serial: got %s, want %s", got, srv.Serial)
		}
	})
}

// TestTLSRotation: replacing the certificate and key files takes effect
// at the next handshake without a restart, a half-done rotation (new
// certificate, old key) keeps the old pair serving, and an attach opened
// before the rotation keeps streaming to the exit.
func TestTLSRotation(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	srv := ca.Server(t, "runnerd")
	a := tlsDaemon(t, ca, srv, "", nil)
	addr := strings.TrimPrefix(a.base, "https://")

	a.createSandbox("rot")
	ss := a.spawn("rot", wire.CreateSession{Argv: []string{"sh", "-c", "echo first; cat >/dev/null; echo second; exit 7"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "wss://"+addr+"/v1/sandboxes/rot/sessions/"+ss.ID+"/attach?stdout=0",
		&websocket.DialOptions{HTTPClient: a.hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + testToken}}})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	defer conn.CloseNow()
	var mu sync.Mutex
	var out bytes.Buffer
	var exit *wire.Exit
	done := make(chan error, 1)
	first := make(chan struct{})
	go func() { // ends at the terminal frame or a read error
		var once sync.Once
		for {
			_, msg, err := conn.Read(ctx)
			if err != nil {
				done <- err
				return
			}
			f, err := wire.ParseFrame(msg)
			if err != nil {
				done <- err
				return
			}
			mu.Lock()
			switch f.Kind {
			case wire.FrameData:
				out.Write(f.Payload)
				if strings.Contains(out.String(), "first\n") {
					once.Do(func() { close(first) })
				}
			case wire.FrameExit:
				e, err := f.Exit()
				exit = &e
				mu.Unlock()
				done <- err
				return
			}
			mu.Unlock()
		}
	}()
	select {
	case <-first:
	case err := <-done:
		t.Fatalf("attach ended before the first line: %v", err)
	}

	// Half a rotation: a new certificate beside the old key does not load;
	// the old pair keeps serving.
	next := ca.Server(t, "next")
	copyFile(t, next.CertFile, srv.CertFile)
	if got := peerSerial(t, addr, ca.Pool(), nil); got != srv.Serial.String() {
		t.Fatalf("after a half rotation: serial %s, want the old %s", got, srv.Serial)
	}
	copyFile(t, next.KeyFile, srv.KeyFile)
	if got := peerSerial(t, addr, ca.Pool(), nil); got != next.Serial.String() {
		t.Fatalf("after the rotation: serial %s, want the new %s", got, next.Serial)
	}

	a.hc.CloseIdleConnections() // new calls handshake with the new pair
	a.must("POST", "/v1/sandboxes/rot/sessions/"+ss.ID+"/close-stdin", nil, 204, nil)
	if err := <-done; err != nil {
		t.Fatalf("attach across the rotation: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if out.String() != "first\nsecond\n" || exit == nil || exit.Reason != "exited" || exit.Code != 7 {
		t.Fatalf("attach across the rotation: got %q exit %+v, want \"first\\nsecond\\n\" and exit 7", out.String(), exit)
	}
}

// TestPlainNonLoopbackRefused: without TLS, runnerd refuses to serve on a
// non-loopback address (before binding it) unless InsecureListen, and
// with it, warns at start.
func TestPlainNonLoopbackRefused(t *testing.T) {
	for _, tc := range []struct {
		name          string
		listen        string
		previewListen string
	}{
		{"api on the wildcard", "0.0.0.0:0", ""},
		{"api on an empty host", ":0", ""},
		{"preview on the wildcard", "none", "0.0.0.0:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, Cgroups: daemon.CgroupsOff,
				Listen: tc.listen, Socket: "none", PreviewListen: tc.previewListen, Logger: testLogger(t)}
			if tc.previewListen != "" {
				cfg.Socket = t.TempDir() + "/s.sock"
				cfg.PreviewURLTemplate = "http://{token}.localhost/"
			}
			cfg.ShimCommand = []string{runnerdBin, "shim"}
			// Bounded: without the defence Run would serve until ctx ends.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := daemon.Run(ctx, cfg)
			if !errors.Is(err, daemon.ErrInsecureListen) {
				t.Fatalf("Run: got %v, want ErrInsecureListen", err)
			}
		})
	}
	t.Run("insecure-listen serves and warns", func(t *testing.T) {
		var logs lockedBuffer
		l, err := net.Listen("tcp", "0.0.0.0:0") // bound on every address; only loopback is dialed
		if err != nil {
			t.Fatal(err)
		}
		cfg := daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, InsecureListen: true,
			TCPListener: l, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		a := startDaemonCfg(t, cfg)
		_, port, _ := net.SplitHostPort(l.Addr().String())
		a.base = "http://127.0.0.1:" + port
		if r := a.do("GET", "/v1/capabilities", nil); r.status != 200 {
			t.Fatalf("GET over --insecure-listen: got %d", r.status)
		}
		if !strings.Contains(logs.String(), "serving plain HTTP on a non-loopback address") {
			t.Fatalf("no warning at start; logs:\n%s", logs.String())
		}
	})
}

// TestTLSConfigRefused: half a pair, a client CA without a pair, a key
// that is not the certificate's and a CA file without a certificate fail
// Run with ErrTLSConfig, and nothing listens.
func TestTLSConfigRefused(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	srv := ca.Server(t, "runnerd")
	other := ca.Server(t, "other")
	for _, tc := range []struct {
		name           string
		cert, key, cca string
	}{
		{"cert without key", srv.CertFile, "", ""},
		{"client CA without a pair", "", "", ca.CertFile},
		{"key of another certificate", srv.CertFile, other.KeyFile, ""},
		{"missing file", dir + "/absent.pem", srv.KeyFile, ""},
		{"client CA holds no certificate", srv.CertFile, srv.KeyFile, srv.KeyFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			err = daemon.Run(context.Background(), daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
				Cgroups: daemon.CgroupsOff, Socket: "none", TCPListener: l, ShimCommand: []string{runnerdBin, "shim"},
				TLSCert: tc.cert, TLSKey: tc.key, TLSClientCA: tc.cca, Logger: testLogger(t)})
			if !errors.Is(err, daemon.ErrTLSConfig) {
				t.Fatalf("Run: got %v, want ErrTLSConfig", err)
			}
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				t.Fatalf("%s still accepts connections after Run failed", addr)
			}
		})
	}
}

func readListenFile(t *testing.T, state string) wire.Listen {
	t.Helper()
	b, err := os.ReadFile(state + "/" + wire.ListenFile)
	if err != nil {
		t.Fatal(err)
	}
	var l wire.Listen
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// copyFile replaces dst with src's bytes by rename, as a Secret update or
// an operator's mv does.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dst+".new", dst); err != nil {
		t.Fatal(err)
	}
}

// TestTLSPreviewListener: the preview listener speaks TLS with the same
// certificate and, with a client CA configured, still asks browsers for
// no client certificate.
func TestTLSPreviewListener(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	srv := ca.Server(t, "runnerd")
	addr := freeLoopback(t)
	_, port, _ := net.SplitHostPort(addr)
	cl := ca.Client(t, "control-plane")
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		TLSCert: srv.CertFile, TLSKey: srv.KeyFile, TLSClientCA: ca.CertFile,
		PreviewListen: addr, PreviewURLTemplate: "https://{token}.localhost:" + port + "/"})
	a.base = strings.Replace(a.base, "http://", "https://", 1)
	a.hc = tlsHTTPClient(ca.Pool(), &cl.TLS)
	if got := peerSerial(t, addr, ca.Pool(), nil); got != srv.Serial.String() {
		t.Fatalf("preview certificate serial: got %s, want %s", got, srv.Serial)
	}
}
