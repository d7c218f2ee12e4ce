package client_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/internal/testpki"
	"github.com/agentrunner/runner/wire"
)

// mtlsDaemon starts a runnerd with TLS and client certificates required,
// and returns it with the PKI: its CA, a good client pair and a client
// pair of another CA.
func mtlsDaemon(t *testing.T) (d *daemon, ca *testpki.CA, good, stranger testpki.Pair) {
	t.Helper()
	dir := t.TempDir()
	ca = testpki.NewCA(t, dir, "ca")
	srv := ca.Server(t, "runnerd")
	good = ca.Client(t, "control-plane")
	stranger = testpki.NewCA(t, dir, "other").Client(t, "stranger")
	d = startDaemon(t, "--netpolicy", "off", "--tls-cert", srv.CertFile, "--tls-key", srv.KeyFile, "--tls-client-ca", ca.CertFile)
	return d, ca, good, stranger
}

// TestClientTLS: over https with the CA and a client certificate the
// client is served (an exec's bytes and exit code come back exact); a
// certificate the server refuses (none, another CA's) and a server
// certificate the client cannot verify are denied; an https runner that
// is not there is unavailable. None is not_found.
func TestClientTLS(t *testing.T) {
	d, ca, good, stranger := mtlsDaemon(t)
	ctx := context.Background()

	c, err := client.New(d.url(), d.token, client.Options{RootCAs: ca.Pool(), Certificate: &good.TLS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "tls"}); err != nil {
		t.Fatalf("create over mTLS: %v", err)
	}
	res, err := c.Exec(ctx, "tls", wire.Exec{Argv: []string{"sh", "-c", "printf 'a\\0b'; exit 5"}})
	if err != nil {
		t.Fatalf("exec over mTLS: %v", err)
	}
	if string(res.Stdout) != "a\x00b" || res.Exit.Code != 5 {
		t.Fatalf("exec over mTLS: got %q exit %d, want \"a\\x00b\" exit 5", res.Stdout, res.Exit.Code)
	}
	fr, err := c.Attach(ctx, "tls", res.Session, client.Cursors{})
	if err != nil {
		t.Fatalf("attach over mTLS: %v", err)
	}
	var got []byte
	for {
		f, err := fr.Next()
		if err != nil {
			t.Fatalf("attach over mTLS: %v", err)
		}
		if f.Kind == wire.FrameData {
			got = append(got, f.Payload...)
			continue
		}
		e, err := f.Exit()
		if err != nil || e.Code != 5 || string(got) != "a\x00b" {
			t.Fatalf("attach over mTLS: got %q, %+v, %v; want \"a\\x00b\" exit 5", got, e, err)
		}
		break
	}
	fr.Close()

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "https://" + closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		name     string
		endpoint string
		opts     client.Options
		want     error
	}{
		{"no client certificate", d.url(), client.Options{RootCAs: ca.Pool()}, adapter.ErrDenied},
		{"client certificate of another CA", d.url(), client.Options{RootCAs: ca.Pool(), Certificate: &stranger.TLS}, adapter.ErrDenied},
		{"server certificate of an unknown CA", d.url(), client.Options{Certificate: &good.TLS}, adapter.ErrDenied},
		{"server certificate for another name", d.url(), client.Options{RootCAs: ca.Pool(), Certificate: &good.TLS, ServerName: "other.runner-system"}, adapter.ErrDenied},
		{"nothing listening", gone, client.Options{RootCAs: ca.Pool(), Certificate: &good.TLS}, adapter.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New(tc.endpoint, d.token, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.GetSandbox(ctx, "tls")
			if !errors.Is(err, tc.want) || errors.Is(err, adapter.ErrNotFound) {
				t.Fatalf("GetSandbox: got %v, want %v", err, tc.want)
			}
			_, err = c.Attach(ctx, "tls", res.Session, client.Cursors{})
			if !errors.Is(err, tc.want) {
				t.Fatalf("Attach: got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestDiscoverTLS: Discover reads the listen file's tls and dials https,
// with the CA and client certificate $RUNNERD_CA, $RUNNERD_CLIENT_CERT
// and $RUNNERD_CLIENT_KEY name; half a client pair is an error.
func TestDiscoverTLS(t *testing.T) {
	d, ca, good, _ := mtlsDaemon(t)
	t.Setenv("RUNNERD_URL", "")
	t.Setenv("RUNNERD_TOKEN", "")
	t.Setenv("STATE_DIRECTORY", d.state)
	t.Setenv(client.EnvCA, ca.CertFile)
	t.Setenv(client.EnvClientCert, good.CertFile)
	t.Setenv(client.EnvClientKey, good.KeyFile)
	c := discovered(t, d.url())
	if _, err := c.Capacity(context.Background()); err != nil {
		t.Fatalf("Capacity through Discover over mTLS: %v", err)
	}
	t.Setenv(client.EnvClientKey, "")
	l, err := client.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.New(client.Options{}); err == nil {
		t.Fatal("Local.New with a client certificate and no key: got nil error")
	}
	empty := filepath.Join(t.TempDir(), "empty.pem")
	os.WriteFile(empty, nil, 0o600)
	if err := (client.TLSFiles{CA: empty}).Apply(&client.Options{}); err == nil {
		t.Fatal("Apply with a CA file holding no certificate: got nil error")
	}
}
