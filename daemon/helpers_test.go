package daemon_test

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"testing"
	"time"

	"github.com/agentrunner/runner/netpolicy/netlab"
)

// netStateDir is a fresh directory for runnerd's network state; mounts
// left in it are unmounted at t's cleanup.
func netStateDir(t *testing.T) string {
	t.Helper()
	netState := t.TempDir()
	t.Cleanup(func() { netlab.UnmountLeftovers(netState) })
	return netState
}

// startHostile starts runnerd as its own process over lab, with a state
// directory its sandboxes' uids can pass through and a network state
// directory of its own (startRunnerdProc).
func startHostile(t *testing.T, lab *netlab.Lab, args ...string) (*api, *proc) {
	t.Helper()
	state := passableTempDir(t)
	return startRunnerdProc(t, lab, state, netStateDir(t), args...)
}

// subtests returns run: run(name, fn) runs fn as a subtest of t0 with
// a's failures reported into that subtest, and back into t0 after it.
func (a *api) subtests(t0 *testing.T) func(name string, fn func(t *testing.T)) {
	return func(name string, fn func(t *testing.T)) {
		t0.Run(name, func(t *testing.T) {
			a.t = t
			defer func() { a.t = t0 }()
			fn(t)
		})
	}
}

// startLogged starts cmd with its output in t's log (until t ends) and
// returns the process, whose done receives cmd.Wait's result.
func startLogged(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	lw := &logWriter{t: t}
	t.Cleanup(func() { lw.mu.Lock(); lw.done = true; lw.mu.Unlock() })
	cmd.Stdout, cmd.Stderr = lw, lw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p
}

// unixHTTP is an HTTP client (60 s a request) that dials runnerd's unix
// socket sock whatever the URL's host.
func unixHTTP(sock string) *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

// waitUp polls a's /healthz every 20 ms until it answers 200; it fails
// t if runnerd (p) exits first or 30 s pass.
func (a *api) waitUp(t *testing.T, p *proc) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := a.hc.Get(a.base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("runnerd did not come up")
		}
		select {
		case err := <-p.done:
			t.Fatalf("runnerd exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// freeLoopback returns a loopback TCP address that was free a moment ago
// (bound and released), for a listener the daemon is to open.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
