package client_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

// conformanceOptions are short deadlines, so that a call during an induced
// outage fails fast instead of using up the subtest's time.
var conformanceOptions = client.Options{
	ConnectTimeout:   2 * time.Second,
	RequestTimeout:   3 * time.Second,
	HeartbeatTimeout: 60 * time.Second,
	ExecLiveness:     time.Second,
}

// conformanceAdapter is a runner adapter over a fresh client of url, closed
// when the subtest ends.
func conformanceAdapter(t conformance.T, url, token string) *client.Adapter {
	c, err := client.New(url, token, conformanceOptions)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := client.NewAdapter(ctx, c, client.AdapterOptions{})
	if err != nil {
		c.Close()
		t.Fatalf("NewAdapter: %v", err)
	}
	t.Cleanup(func() { a.Close(); c.Close() })
	return a
}

// TestConformance runs the whole contract suite against a real runnerd
// started by the test. The outage hook SIGSTOPs the daemon (the kernel
// still accepts connections, nothing answers: the nastiest outage) and
// SIGCONTs it at restore; the interrupted-listing hook cuts the next
// listing mid-body in a proxy in front of the daemon.
func TestConformance(t *testing.T) {
	d := startDaemon(t)
	p := startProxy(t, d.url())
	t.Cleanup(p.close)
	conformance.Run(t, conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			return conformance.Subject{
				Adapter: conformanceAdapter(t, p.url(), d.token),
				Outage: func() func() {
					d.signal(syscall.SIGSTOP)
					return func() { d.signal(syscall.SIGCONT) }
				},
				InterruptList: p.interruptList,
			}
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  60 * time.Second,
	})
}

// TestConformanceKillRestart runs the outage subtest again with the other
// kind of outage: the daemon is killed with SIGKILL and restarted on the
// same state directory and port at restore. Sessions survive it (they run
// under detached shims), and a Stream with a ReattachWindow attaches again
// from its cursor once the daemon is back, byte-exactly.
func TestConformanceKillRestart(t *testing.T) {
	d := startDaemon(t)
	for _, tc := range conformance.Tests() {
		if tc.Name != "Get/OutageIsNeverNotFound" && tc.Name != "Get/NotFoundAfterDestroy" {
			continue
		}
		t.Run(tc.Name, func(t *testing.T) {
			tc.Func(t, conformance.Harness{
				New: func(t conformance.T) conformance.Subject {
					c, err := client.New(d.url(), d.token, conformanceOptions)
					if err != nil {
						t.Fatalf("client.New: %v", err)
					}
					a, err := client.NewAdapter(context.Background(), c, client.AdapterOptions{ReattachWindow: 30 * time.Second})
					if err != nil {
						t.Fatalf("NewAdapter: %v", err)
					}
					t.Cleanup(func() { a.Close(); c.Close() })
					return conformance.Subject{Adapter: a, Outage: func() func() {
						d.kill9()
						return func() { d.restart(t.(*testing.T)) }
					}}
				},
				Fixtures: conformance.ShellFixtures(),
				Timeout:  60 * time.Second,
			})
		})
	}
}

// TestConformanceNetworkPolicy runs the network_policy subtest for real:
// runnerd enforces policies (as root, with network namespaces and
// nf_tables), but only inside a world of namespaces the test builds
// (netpolicy/netlab), so the real host's network is never touched. The probe
// connects to a test host in that world; nothing else is ever addressed.
func TestConformanceNetworkPolicy(t *testing.T) {
	lab := netlab.New(t) // skips, loudly, without root, netns or nf_tables
	netState := t.TempDir()
	t.Cleanup(func() { netlab.UnmountLeftovers(netState) }) // after d.stop: cleanups run last-in first-out
	// runnerd's default isolation (as root: every sandbox isolated, with
	// its own identity and network namespace from the start), which the
	// suite's create-then-set-policy needs: a policy on a sandbox whose
	// commands run as root is refused.
	d := startDaemon(t, lab.RunnerdArgs(netState)...)
	fx := conformance.ShellFixtures()
	fx.Probe = func(host string) adapter.Command {
		argv := netlab.ProbeArgv(host)
		return adapter.Command{Path: argv[0], Args: argv[1:]}
	}
	fx.ProbeHost = netlab.A.String()
	h := conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			c, err := client.New(d.url(), d.token, conformanceOptions)
			if err != nil {
				t.Fatalf("client.New: %v", err)
			}
			a, err := client.NewAdapter(context.Background(), c, client.AdapterOptions{})
			if err != nil {
				c.Close()
				t.Fatalf("NewAdapter: %v", err)
			}
			t.Cleanup(func() { a.Close(); c.Close() })
			if !a.Capabilities().Has(adapter.CapNetworkPolicy) {
				t.Fatalf("runnerd in the lab does not advertise network_policy: %v\n%s", a.Capabilities(), d.logTail())
			}
			return conformance.Subject{Adapter: a}
		},
		Fixtures: fx,
		Timeout:  60 * time.Second,
	}
	ran := false
	for _, tc := range conformance.Tests() {
		if tc.Name == "Capability/network_policy" {
			ran = true
			t.Run(tc.Name, func(t *testing.T) { tc.Func(t, h) })
		}
	}
	if !ran {
		t.Fatal("the suite has no Capability/network_policy subtest any more")
	}
}
