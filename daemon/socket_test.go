package daemon_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
)

// TestUnixSocketPrivate: the socket is 0600 in place, the temporary
// directory it was bound in is gone, it serves, and a clean stop removes it.
func TestUnixSocketPrivate(t *testing.T) {
	state := t.TempDir()
	sock := filepath.Join(state, "runnerd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	errc := make(chan error, 1)
	cgRoot := testCgroupRoot(t)
	go func() {
		errc <- daemon.Run(ctx, daemon.Config{
			StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff, CgroupRoot: cgRoot,
			Listen: "none", Socket: sock, ShimCommand: []string{runnerdBin, "shim"},
			WarmShims: -1, Logger: testLogger(t), Ready: func(string) { close(ready) },
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("daemon.Run: %v", err)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode: got %v, want a 0600 socket", fi.Mode())
	}
	di, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm()&0o066 != 0 {
		t.Errorf("state directory mode: got %v, want no read or write for others", di.Mode().Perm())
	}
	if tmp, _ := filepath.Glob(filepath.Join(state, ".sock*")); len(tmp) != 0 {
		t.Errorf("temporary socket directories left: %v", tmp)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := hc.Get("http://runnerd/healthz")
	if err != nil {
		t.Fatalf("healthz over the socket: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz over the socket: got %d, want 200", resp.StatusCode)
	}
	hc.CloseIdleConnections()
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("daemon.Run: %v", err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket after a clean stop: got %v, want it removed", err)
	}
}
