package fleet_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/internal/runnerdtest"
)

// runnerdBin is the real runnerd, built once in TestMain.
var runnerdBin string

func TestMain(m *testing.M) {
	os.Exit(runnerdtest.Main(m, "fleet-test-", func(bin string) error { runnerdBin = bin; return nil }))
}

// daemon is a runner endpoint: a real runnerd started by startDaemon
// (internal/runnerdtest), or only an address and a token.
type daemon struct {
	d           *runnerdtest.Daemon
	addr, token string
}

// startDaemon starts a runnerd on a fresh state directory and loopback
// port (runnerdtest.Start).
func startDaemon(tb testing.TB, flags ...string) *daemon {
	tb.Helper()
	d := runnerdtest.Start(tb, runnerdBin, flags...)
	return &daemon{d: d, addr: d.Addr, token: d.Token}
}

func (d *daemon) url() string               { return "http://" + d.addr }
func (d *daemon) signal(sig syscall.Signal) { d.d.Signal(sig) }
func (d *daemon) stop()                     { d.d.Stop() }
func (d *daemon) kill9()                    { d.d.Kill9() }
func (d *daemon) restart(tb testing.TB)     { tb.Helper(); d.d.Restart(tb) }

// proxy can cut the next sandbox listing mid-body.
type proxy struct{ p *runnerdtest.Proxy }

func startProxy(tb testing.TB, upstream string) *proxy {
	tb.Helper()
	return &proxy{runnerdtest.StartProxy(tb, upstream)}
}

func (p *proxy) url() string    { return p.p.URL() }
func (p *proxy) interruptList() { p.p.InterruptList() }
func (p *proxy) close()         { p.p.Close() }
