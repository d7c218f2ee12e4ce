package daemon_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// twoRunnerdsPerDaemon is how many contained sandboxes each runnerd
// holds (issue #36: 20 + 20).
const twoRunnerdsPerDaemon = 20

// netRunnerd is one runnerd of TestTwoRunnerdsOwnTables, restartable on
// the same state.
type netRunnerd struct {
	name, state, net string
	lab              *netlab.Lab
	args             []string
	a                *api
	p                *proc
}

func (r *netRunnerd) start(t *testing.T) {
	t.Helper()
	r.a, r.p = startRunnerdProc(t, r.lab, r.state, r.net, r.args...)
}

// probeAll wants every sandbox of r to resolve allowed.test through its
// resolver and open a connection to it (A, outside, in the lab).
func (r *netRunnerd) probeAll(t *testing.T, when string) {
	t.Helper()
	r.a.t = t
	for i := range twoRunnerdsPerDaemon {
		name := fmt.Sprintf("%s-%d", r.name, i)
		res := r.a.exec(name, wire.Exec{Argv: netlab.ProbeArgv("allowed.test"), TimeoutMS: 20000})
		if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
			t.Errorf("%s: sandbox %s of runnerd %s lost egress: probe of allowed.test exit %+v, stderr %q",
				when, name, r.name, res.Exit, res.Stderr)
		}
	}
}

func (r *netRunnerd) table(t *testing.T) string {
	t.Helper()
	r.a.t = t
	var in wire.Info
	r.a.must("GET", "/v1/info", nil, 200, &in)
	return in.NetworkTable
}

// TestTwoRunnerdsOwnTables: two root runnerds on one host (the lab's),
// each with its own state, cgroup root, netpolicy state and pool, as
// docs/operations.md says. Every contained sandbox of both keeps egress
// and DNS after each start, restart and kill -9 of the other. Before,
// both used the table inet runner: the second start rewrote the first's
// base chains and emptied its dispatch map (and each table's catch-all
// rn* drops hit the other's veths), so every sandbox of the first lost
// egress and DNS while GET still showed its policy. A runnerd on the
// other's netpolicy state directory or on an overlapping pool refuses to
// start, naming it.
func TestTwoRunnerdsOwnTables(t *testing.T) {
	lab := netlab.New(t)
	claims := t.TempDir()
	mk := func(name, pool string) *netRunnerd {
		l := *lab // the same world, its own pool
		l.Pool = netip.MustParsePrefix(pool)
		r := &netRunnerd{name: name, state: passableTempDir(t), net: t.TempDir(), lab: &l,
			args: []string{"--claim-dir", claims}}
		t.Cleanup(func() { netlab.UnmountLeftovers(r.net) })
		return r
	}
	a := mk("a", "10.98.0.0/25")
	b := mk("b", "10.98.0.128/25")
	create := func(r *netRunnerd) {
		t.Helper()
		for i := range twoRunnerdsPerDaemon {
			r.a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: fmt.Sprintf("%s-%d", r.name, i),
				Network: &wire.Network{Allow: []string{"allowed.test"}}}, 200, nil)
		}
	}
	a.start(t)
	create(a)
	a.probeAll(t, "a alone")
	b.start(t)
	a.probeAll(t, "after b started")
	create(b)
	b.probeAll(t, "b's first")
	a.probeAll(t, "after b made its sandboxes")

	ta, tb := a.table(t), b.table(t)
	if ta == "" || tb == "" || ta == tb {
		t.Fatalf("GET /v1/info network_table: a %q, b %q: want two different tables", ta, tb)
	}
	for _, r := range []*netRunnerd{a, b} {
		saved, err := os.ReadFile(filepath.Join(r.net, "table"))
		if got := r.table(t); err != nil || strings.TrimSpace(string(saved)) != got || !strings.HasPrefix(got, netpolicy.TablePrefix) {
			t.Errorf("runnerd %s: info says table %q, its netpolicy state saved %q (%v): want the same %sXXXX", r.name, got, saved, err, netpolicy.TablePrefix)
		}
	}

	for _, step := range []struct {
		name   string
		victim *netRunnerd
		other  *netRunnerd
		sig    syscall.Signal
	}{
		{"restart a", a, b, syscall.SIGTERM},
		{"restart b", b, a, syscall.SIGTERM},
		{"kill -9 b", b, a, syscall.SIGKILL},
		{"kill -9 a", a, b, syscall.SIGKILL},
	} {
		step.victim.p.kill(step.sig)
		// The other's sandboxes while this one is down (its own have no
		// resolver then: they are not probed).
		step.other.probeAll(t, step.name+": while "+step.victim.name+" is down")
		want := map[*netRunnerd]string{a: ta, b: tb}[step.victim]
		step.victim.start(t)
		if got := step.victim.table(t); got != want {
			t.Errorf("%s: table %q after the restart, want %q (the same)", step.name, got, want)
		}
		step.other.probeAll(t, step.name+": after "+step.victim.name+" started again")
		step.victim.probeAll(t, step.name+": its own after it started again")
	}

	t.Run("shared netpolicy state refused", func(t *testing.T) {
		l := *lab
		l.Pool = netip.MustParsePrefix("10.98.1.0/24")
		secondRunnerd(t, passableTempDir(t), []string{"netpolicy state directory", a.state, fmt.Sprint(a.p.cmd.Process.Pid)},
			append([]string{"--claim-dir", claims, "--cgroup-root", testCgroupRoot(t)}, l.RunnerdArgs(a.net)...)...)
	})
	t.Run("overlapping pool refused", func(t *testing.T) {
		l := *lab
		l.Pool = netip.MustParsePrefix("10.98.0.192/26") // inside b's
		secondRunnerd(t, passableTempDir(t), []string{"address pool", b.state, fmt.Sprint(b.p.cmd.Process.Pid)},
			append([]string{"--claim-dir", claims, "--cgroup-root", testCgroupRoot(t)}, l.RunnerdArgs(t.TempDir())...)...)
	})
	a.probeAll(t, "after the refused runnerds")
	b.probeAll(t, "after the refused runnerds")
}
