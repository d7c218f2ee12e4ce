package cli

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testpki"
	"github.com/agentrunner/runner/wire"
)

// TestCLIOverMTLS: runner reaches a runnerd that serves TLS and requires
// client certificates, with --ca, --cert and --key or with RUNNERD_CA,
// RUNNERD_CLIENT_CERT and RUNNERD_CLIENT_KEY: an exec's output and exit
// code come back exact. Without the client certificate, or without the
// CA, it exits 251 (denied); half a client pair is a usage error (2).
func TestCLIOverMTLS(t *testing.T) {
	pki := t.TempDir()
	ca := testpki.NewCA(t, pki, "ca")
	srv, cl := ca.Server(t, "runnerd"), ca.Client(t, "cli")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	state := t.TempDir()
	const token = "cli-tls-token-0123456789abcdef"
	d := exec.Command(filepath.Join(binDir, "runnerd"), "--state", state, "--listen", addr, "--socket", "none",
		"--netpolicy", "off", "--cgroups", "off", "--tls-cert", srv.CertFile, "--tls-key", srv.KeyFile, "--tls-client-ca", ca.CertFile)
	d.Env = append(os.Environ(), "RUNNERD_TOKEN="+token)
	log := &syncBuffer{}
	d.Stdout, d.Stderr = log, log
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Process.Signal(os.Interrupt); d.Wait() })
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(log.String(), "runnerd serving"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("runnerd did not start: %s", log.String())
		}
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte(token), 0o600)
	base := cliEnv()
	flags := []string{"--url", "https://" + addr, "--token-file", tokFile}
	run := func(env []string, args ...string) (string, string, int) {
		t.Helper()
		o, e, code := runCLIEnv(env, nil, append(append([]string{}, flags...), args...)...)
		return string(o), string(e), code
	}
	tlsFlags := []string{"--ca", ca.CertFile, "--cert", cl.CertFile, "--key", cl.KeyFile}
	if _, e, code := run(base, append(tlsFlags, "create", "tlsbox")...); code != 0 {
		t.Fatalf("create over mTLS with flags: exit %d: %s", code, e)
	}
	t.Cleanup(func() { run(base, append(tlsFlags, "rm", "tlsbox")...) })
	envTLS := append(cliEnv(), "RUNNERD_CA="+ca.CertFile, "RUNNERD_CLIENT_CERT="+cl.CertFile, "RUNNERD_CLIENT_KEY="+cl.KeyFile)
	o, e, code := run(envTLS, "exec", "tlsbox", "--", "sh", "-c", "printf 'over tls'; exit 6")
	if o != "over tls" || code != 6 {
		t.Fatalf("exec over mTLS from the environment: %q exit %d (%s), want \"over tls\" exit 6", o, code, e)
	}
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"no client certificate", []string{"--ca", ca.CertFile}, wire.RunnerExitDenied},
		{"no CA", []string{"--cert", cl.CertFile, "--key", cl.KeyFile}, wire.RunnerExitDenied},
		{"a certificate without its key", []string{"--ca", ca.CertFile, "--cert", cl.CertFile}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, e, code := run(base, append(tc.args, "exec", "tlsbox", "--", "true")...); code != tc.want {
				t.Fatalf("exit %d (%s), want %d", code, e, tc.want)
			}
		})
	}
}
