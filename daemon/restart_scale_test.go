package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// restartScaleN is how many contained sandboxes TestRestartContainedScale
// holds. CI runs a few; docs/benchmarks.md's restart figures are this
// test run with -restart.sandboxes=1000 on a quiet machine (it logs them;
// it never asserts a time).
var restartScaleN = flag.Int("restart.sandboxes", 24, "contained sandboxes TestRestartContainedScale holds (issue #36's figure: 1000)")

// restartScalePool has room for 1,024 sandboxes and overlaps nothing in
// the lab.
var restartScalePool = netip.MustParsePrefix("10.100.0.0/20")

// TestRestartContainedScale: a root runnerd with N contained sandboxes,
// each with a running session, is killed (-9) and started again on the
// same state. The new runnerd serves before their networks are
// re-adopted (that runs in the background, and GET /v1/info counts what
// is left in network_pending): /healthz answers, an attach to an old
// session reads its output from byte 0, and every sandbox (probed: all of
// them up to 50, else a sample with the first and the last) resolves and
// reaches the lab host its policy allows — a call that needs a sandbox
// not yet re-adopted adopts it first. network_pending reaches 0, and
// destroying every sandbox leaves no netns behind.
func TestRestartContainedScale(t *testing.T) {
	n := *restartScaleN
	lab := netlab.New(t)
	l := *lab
	l.Pool = restartScalePool
	state, netState := passableTempDir(t), t.TempDir()
	t.Cleanup(func() { netlab.UnmountLeftovers(netState) })
	a, p := startRunnerdProc(t, &l, state, netState)

	name := func(i int) string { return fmt.Sprintf("rs-%04d", i) }
	t0 := time.Now()
	forEach(t, n, 16, func(i int) error {
		if r := a.doErr("POST", "/v1/sandboxes", wire.CreateSandbox{Name: name(i),
			Network: &wire.Network{Allow: []string{"allowed.test"}}}); r.err != nil || r.status != 200 {
			return fmt.Errorf("create %s: %v %d %s", name(i), r.err, r.status, r.body)
		}
		argv := []string{"sleep", "infinity"}
		if i == 0 {
			argv = []string{"sh", "-c", "echo hello from before; exec sleep infinity"}
		}
		if r := a.doErr("POST", "/v1/sandboxes/"+name(i)+"/sessions", wire.CreateSession{ID: "s", Argv: argv}); r.err != nil || r.status != 201 {
			return fmt.Errorf("spawn in %s: %v %d %s", name(i), r.err, r.status, r.body)
		}
		return nil
	})
	t.Logf("created %d contained sandboxes, each with a running session, in %v", n, time.Since(t0).Round(time.Millisecond))
	probed := probeSample(n)
	probe := func(a *api, when string) {
		t.Helper()
		forEach(t, len(probed), 8, func(k int) error {
			sb := name(probed[k])
			r := a.doErr("POST", "/v1/sandboxes/"+sb+"/exec", wire.Exec{Argv: netlab.ProbeArgv("allowed.test"), TimeoutMS: 20000})
			if r.err != nil || r.status != 200 {
				return fmt.Errorf("%s: exec in %s: %v %d %s", when, sb, r.err, r.status, r.body)
			}
			var res wire.ExecResult
			if err := json.Unmarshal(r.body, &res); err != nil {
				return err
			}
			if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
				return fmt.Errorf("%s: sandbox %s lost egress: probe exit %+v, stderr %q", when, sb, res.Exit, res.Stderr)
			}
			return nil
		})
	}
	probe(a, "before the restart")

	p.kill(syscall.SIGKILL)
	t1 := time.Now()
	a2, _ := startRunnerdProc(t, &l, state, netState) // returns at the first 200 of /healthz
	healthz := time.Since(t1)
	var info wire.Info
	a2.must("GET", "/v1/info", nil, 200, &info)
	pendingAtServe := info.NetworkPending

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := a2.attach(ctx, name(0), "s", "", func(f wire.Frame) bool { return true })
	attached := time.Since(t1)
	if want := "hello from before\n"; string(got.streams["stdout"]) != want {
		t.Fatalf("attach to the old session after the restart: stdout %q (error %+v), want %q", got.streams["stdout"], got.errBody, want)
	}
	for {
		info = wire.Info{} // network_pending is omitted once 0
		a2.must("GET", "/v1/info", nil, 200, &info)
		if info.NetworkPending == 0 {
			break
		}
		if time.Since(t1) > 5*time.Minute {
			t.Fatalf("network_pending still %d five minutes after the restart", info.NetworkPending)
		}
		time.Sleep(5 * time.Millisecond)
	}
	adopted := time.Since(t1)
	t.Logf("restart with %d contained sandboxes: /healthz answered after %v (network_pending %d then), attach to an old session read its first frame after %v, every network re-adopted after %v",
		n, healthz.Round(time.Millisecond), pendingAtServe, attached.Round(time.Millisecond), adopted.Round(time.Millisecond))
	probe(a2, "after kill -9 and restart")

	t2 := time.Now()
	forEach(t, n, 16, func(i int) error {
		if r := a2.doErr("DELETE", "/v1/sandboxes/"+name(i), nil); r.err != nil || r.status != 204 {
			return fmt.Errorf("destroy %s: %v %d %s", name(i), r.err, r.status, r.body)
		}
		return nil
	})
	t.Logf("destroyed %d contained sandboxes, 16 at a time, in %v", n, time.Since(t2).Round(time.Millisecond))
	if left, _ := os.ReadDir(filepath.Join(netState, "netns")); len(left) != 0 {
		t.Errorf("destroy left %d network namespaces in %s/netns", len(left), netState)
	}
}

// probeSample is which of n sandboxes a scale test probes: all up to 50,
// else every n/50th with the first and the last.
func probeSample(n int) []int {
	if n <= 50 {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	var out []int
	for i := 0; i < n-1; i += n / 50 {
		out = append(out, i)
	}
	return append(out, n-1)
}

// forEach runs fn(0..n-1) on workers goroutines and fails the test with
// every error.
func forEach(t *testing.T, n, workers int, fn func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range work {
				errs[i] = fn(i)
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
