package client_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/internal/runnerdtest"
)

// runnerdBin is the real runnerd, built once in TestMain.
var runnerdBin string

func TestMain(m *testing.M) {
	os.Exit(runnerdtest.Main(m, "client-test-", func(bin string) error {
		runnerdBin = bin
		// The runnable Example finds its daemon the way a user's program
		// does: through RUNNERD_URL and RUNNERD_TOKEN.
		ex, err := runnerdtest.Launch(bin)
		if err != nil {
			return err
		}
		os.Setenv("RUNNERD_URL", ex.URL())
		os.Setenv("RUNNERD_TOKEN", ex.Token)
		return nil
	}))
}

// daemon is a real runnerd (internal/runnerdtest) under the names these
// tests use.
type daemon struct {
	*runnerdtest.Daemon
	state, addr, token string
}

// startDaemon starts a runnerd on a fresh state directory and loopback
// port, with network containment off unless flags say otherwise
// (runnerdtest.Start), and stops it when tb ends (a test's own earlier
// stop makes that a no-op).
func startDaemon(tb testing.TB, flags ...string) *daemon {
	tb.Helper()
	d := runnerdtest.Start(tb, runnerdBin, flags...)
	tb.Cleanup(d.Stop)
	return &daemon{Daemon: d, state: d.State, addr: d.Addr, token: d.Token}
}

func (d *daemon) url() string               { return d.URL() }
func (d *daemon) kill9()                    { d.Kill9() }
func (d *daemon) restart(tb testing.TB)     { tb.Helper(); d.Restart(tb) }
func (d *daemon) signal(sig syscall.Signal) { d.Signal(sig) }
func (d *daemon) stop()                     { d.Stop() }
func (d *daemon) logTail() string           { return d.LogTail() }

// proxy is a loopback proxy in front of a daemon that can cut the next
// sandbox listing mid-body.
type proxy struct{ *runnerdtest.Proxy }

func startProxy(tb testing.TB, upstream string) *proxy {
	tb.Helper()
	return &proxy{runnerdtest.StartProxy(tb, upstream)}
}

func (p *proxy) url() string    { return p.URL() }
func (p *proxy) interruptList() { p.InterruptList() }
func (p *proxy) close()         { p.Close() }
