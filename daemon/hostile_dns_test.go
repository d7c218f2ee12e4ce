package daemon_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// The DNS side of the hostile-command suite (issue #34, finding 2): a
// sandbox's command floods its resolver with names whose upstream answers
// 200 addresses each (any domain's owner can make one), or opens tens of
// thousands of TCP connections to it. runnerd's control plane must not
// notice: another sandbox's exec stays fast, the flooding sandbox is
// destroyed promptly, runnerd's threads and descriptors stay bounded.

var dnsFloodFor = flag.Duration("dnsflood.duration", 10*time.Second,
	"how long sandbox A floods its resolver in TestHostileDNSFlood, per case (the acceptance bar of issue #34 is 30s)")

// floodUpstream is the lab address of the test's upstream DNS server.
var floodUpstream = netip.MustParseAddr("10.99.0.5")

// floodAnswers is how many A records the upstream answers per name.
const floodAnswers = 200

var (
	floodOnce sync.Once
	floodBin  string
	floodErr  error
)

// buildDNSFlood builds testdata/dnsflood once, static, next to runnerd,
// where a sandbox's uid can run it.
func buildDNSFlood(t *testing.T) string {
	t.Helper()
	floodOnce.Do(func() {
		floodBin = filepath.Join(filepath.Dir(runnerdBin), "dnsflood")
		cmd := exec.Command("go", "build", "-o", floodBin, "./testdata/dnsflood")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			floodErr = fmt.Errorf("build dnsflood: %v\n%s", err, out)
		}
	})
	if floodErr != nil {
		t.Fatal(floodErr)
	}
	return floodBin
}

// serveFloodDNS adds addr to the lab's "net" namespace and serves DNS
// there (UDP and TCP) that answers every A query with floodAnswers
// addresses in 198.18.0.0/15, new ones for each query, TTL 300. Cleanup
// stops it.
func serveFloodDNS(t *testing.T, lab *netlab.Lab, addr netip.Addr) {
	t.Helper()
	var mu sync.Mutex
	next := uint32(0)
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		resp := new(dns.Msg)
		resp.SetReply(req)
		if len(req.Question) == 1 && req.Question[0].Qtype == dns.TypeA {
			mu.Lock()
			base := next
			next += floodAnswers
			mu.Unlock()
			for i := range uint32(floodAnswers) {
				v := 198<<24 | 18<<16 | (base+i)%(1<<17)
				resp.Answer = append(resp.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
					A:   net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)),
				})
			}
		}
		resp.Compress = true
		if w.LocalAddr().Network() == "udp" {
			size := dns.MinMsgSize
			if o := req.IsEdns0(); o != nil {
				size = int(o.UDPSize())
			}
			resp.Truncate(size) // 200 compressed A records fit 4096
		}
		w.WriteMsg(resp)
	})
	lab.ServeDNS(t, addr, true, handler)
}

// openFDs counts the descriptors process pid holds.
func openFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// sampler records the most threads and descriptors runnerd held while it
// ran.
type sampler struct {
	stop              chan struct{}
	done              chan struct{}
	maxThreads, maxFD int
}

func sample(t *testing.T, pid int) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err == nil {
				for _, l := range strings.Split(string(raw), "\n") {
					if v, ok := strings.CutPrefix(l, "Threads:"); ok {
						n, _ := strconv.Atoi(strings.TrimSpace(v))
						s.maxThreads = max(s.maxThreads, n)
					}
				}
			}
			s.maxFD = max(s.maxFD, openFDs(pid))
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// end stops the sampler and returns its maxima.
func (s *sampler) end() (threads, fds int) {
	close(s.stop)
	<-s.done
	return s.maxThreads, s.maxFD
}

// metric returns the value of the series line that starts with series
// in runnerd's /metrics (-1 when absent).
func (a *api) metric(series string) float64 {
	a.t.Helper()
	r := a.do("GET", "/metrics", nil)
	if r.status != 200 {
		a.t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	for _, l := range strings.Split(string(r.body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				a.t.Fatalf("metric %s: %q", series, l)
			}
			return f
		}
	}
	return -1
}

// loadavg is the host's 1-, 5- and 15-minute load, for the log: the
// figures of these tests are only as quiet as the machine.
func loadavg() string {
	raw, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// load1 is the host's 1-minute load average (0 when unknown).
func load1() float64 {
	raw, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// percentile is the p-th percentile (0 < p ≤ 1) of ds, nearest rank (0
// for none).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// TestHostileDNSFlood: sandbox "flood" sends 5,000 queries a second (25
// times its resolver's rate) for fresh names, each of which the upstream
// answers with 200 addresses, for -dnsflood.duration; first with the open
// egress every sandbox gets by default (nothing to admit), then with an
// allowlist ("*.flood.test", every answer to be admitted). Meanwhile
// sandbox "b" execs `true` back to back and sandbox "c" changes its
// policy and execs `true` every second (both under 2 s). Bars (issue #34): b's exec p99 under 1 s; the
// flooding sandbox destroyed in under 5 s right after its flood; runnerd
// under 100 threads throughout. Before the defences (a commit pair per
// answered address from the query's goroutine, no rate, no bound) a 10 s
// flood left destroy pending for minutes and runnerd with hundreds of
// threads blocked in nfnetlink_rcv_batch.
func TestHostileDNSFlood(t *testing.T) {
	lab := netlab.New(t)
	lab.DNSUpstream = floodUpstream
	serveFloodDNS(t, lab, floodUpstream)
	flood := buildDNSFlood(t)
	a, p := startHostile(t, lab)
	pid := p.cmd.Process.Pid
	t0 := t

	a.createSandbox("b")
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "c", Network: &wire.Network{Allow: []string{"allowed.test"}}}, 200, nil)
	var idle []time.Duration
	for range 10 {
		e0 := time.Now()
		if got := a.run("b", "true"); got != "" {
			t.Fatalf("b: true printed %q", got)
		}
		idle = append(idle, time.Since(e0))
	}
	t.Logf("b's exec without a flood: p50 %v max %v (load: %s)", percentile(idle, 0.5), percentile(idle, 1), loadavg())
	secs := int(dnsFloodFor.Seconds())
	for i, tc := range []struct {
		name    string
		network *wire.Network
	}{
		{"open egress", nil},
		{"allowlist", &wire.Network{Allow: []string{"*.flood.test"}}},
	} {
		t0.Run(tc.name, func(t *testing.T) {
			a.t = t
			defer func() { a.t = t0 }()
			name := fmt.Sprintf("flood%d", i)
			a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: name, Network: tc.network}, 200, nil)
			rateBefore := a.metric(`runnerd_dns_queries_dropped_total{reason="rate"}`)
			capBefore := a.metric("runnerd_dns_addresses_not_admitted_total")
			admittedBefore := a.metric("runnerd_dns_addresses_admitted_total")
			smp := sample(t, pid)
			a.spawn(name, wire.CreateSession{ID: "flood", Argv: []string{a.tool(name, flood), "udp", strconv.Itoa(secs), "5000", "flood.test"}})
			start := time.Now()
			var execs, policies, cExecs []time.Duration
			var cFailed []string
			nextPolicy := start.Add(time.Second)
			for k := 0; time.Since(start) < *dnsFloodFor; k++ {
				e0 := time.Now()
				res := a.exec("b", wire.Exec{Argv: []string{"true"}, TimeoutMS: 20000})
				execs = append(execs, time.Since(e0))
				if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
					t.Fatalf("b's exec during the flood: %+v, stderr %q", res.Exit, res.Stderr)
				}
				if time.Now().After(nextPolicy) {
					allow := []string{"allowed.test"}
					if k%2 == 0 {
						allow = append(allow, "192.0.2.1")
					}
					p0 := time.Now()
					a.putNetwork("c", allow...)
					policies = append(policies, time.Since(p0))
					c0 := time.Now()
					if r := a.do("POST", "/v1/sandboxes/c/exec", wire.Exec{Argv: []string{"true"}, TimeoutMS: 20000}); r.status != 200 {
						cFailed = append(cFailed, fmt.Sprintf("%d %s", r.status, r.body))
					}
					cExecs = append(cExecs, time.Since(c0))
					nextPolicy = time.Now().Add(time.Second)
				}
			}
			d0 := time.Now()
			if r := a.do("DELETE", "/v1/sandboxes/"+name, nil); r.status != 204 {
				t.Fatalf("destroy %s after its flood: %d %s", name, r.status, r.body)
			}
			destroy := time.Since(d0)
			time.Sleep(time.Second) // what the flood left behind, if anything
			threads, fds := smp.end()
			p99 := percentile(execs, 0.99)
			t.Logf("load %s; %v flood: b's execs %d, p50 %v p99 %v max %v; c's policy changes %d, max %v, its execs max %v; destroy %v; runnerd max threads %d, max fds %d",
				loadavg(), *dnsFloodFor, len(execs), percentile(execs, 0.5), p99, percentile(execs, 1), len(policies), percentile(policies, 1),
				percentile(cExecs, 1), destroy, threads, fds)
			rate := a.metric(`runnerd_dns_queries_dropped_total{reason="rate"}`) - rateBefore
			overCap := a.metric("runnerd_dns_addresses_not_admitted_total") - capBefore
			admitted := a.metric("runnerd_dns_addresses_admitted_total") - admittedBefore
			t.Logf("metrics: queries dropped over the rate %v (busy %v), addresses admitted %v in %v commits, not admitted (cap) %v, queue full %v",
				rate, a.metric(`runnerd_dns_queries_dropped_total{reason="busy"}`), admitted, a.metric("runnerd_dns_admission_commits_total"), overCap,
				a.metric("runnerd_dns_admission_queue_full_total"))
			// The latency bars say what runnerd does to other sandboxes;
			// on a host whose load is many times its CPUs (a shared CI
			// box, other test runs) they measure the host instead, and
			// are reported, not judged. The bounds below are judged
			// always: they are what the old resolver broke (its destroy
			// hung for minutes, its threads were hundreds).
			judge := t.Errorf
			if load := load1(); load > float64(8*runtime.NumCPU()) {
				t.Logf("host load %.0f is over 8 per CPU: the latency bars are reported, not judged", load)
				judge = t.Logf
			}
			if p99 >= time.Second {
				judge("b's exec p99 during the flood: %v, want under 1s", p99)
			}
			if destroy >= 5*time.Second {
				t.Errorf("destroying the flooding sandbox took %v, want under 5s", destroy)
			}
			if threads >= 100 {
				t.Errorf("runnerd held up to %d threads, want under 100", threads)
			}
			if len(policies) > 0 && percentile(policies, 1) >= 2*time.Second {
				judge("c's policy change during the flood took up to %v, want under 2s", percentile(policies, 1))
			}
			if len(cExecs) > 0 && percentile(cExecs, 1) >= 2*time.Second {
				judge("c's exec during the flood took up to %v, want under 2s", percentile(cExecs, 1))
			}
			if len(cFailed) > 0 {
				judge("c's execs during the flood failed: %q", cFailed)
			}
			if rate <= 0 {
				t.Errorf("no query counted as dropped over the rate: the flood did not reach the resolver")
			}
			if tc.network != nil && (admitted <= 0 || overCap <= 0) {
				t.Errorf("allowlist flood: %v admitted, %v over the cap; want both > 0 (answers admitted up to the set's size)", admitted, overCap)
			}
			if tc.network == nil && admitted > 0 {
				t.Errorf("open egress flood admitted %v addresses, want none (0.0.0.0/0 holds them)", admitted)
			}
		})
	}
}

// TestHostileDNSTCPConns: sandbox "flood" opens 20,000 TCP connections
// to its resolver and holds them. runnerd's descriptor limit is lowered to
// 8,192 first (so the attack exceeds it wherever the test runs); the
// resolver holds at most netpolicy.ResolverTCPConns of them, and sandbox
// "b"'s execs keep working. Without the bound runnerd ran out of
// descriptors within seconds (the finding: in 8 s) and b's exec failed.
func TestHostileDNSTCPConns(t *testing.T) {
	lab := netlab.New(t)
	flood := buildDNSFlood(t)
	a, p := startHostile(t, lab)
	pid := p.cmd.Process.Pid
	const limit = 8192
	var lim unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = min(lim.Cur, limit)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	a.createSandbox("b")
	a.createSandbox("flood")
	const hold = 12
	base := openFDs(pid)
	smp := sample(t, pid)
	ss := a.spawn("flood", wire.CreateSession{ID: "conns", Argv: []string{a.tool("flood", flood), "tcp", "20000", strconv.Itoa(hold)}})
	start := time.Now()
	execs := 0
	for time.Since(start) < (hold-2)*time.Second {
		r := a.do("POST", "/v1/sandboxes/b/exec", wire.Exec{Argv: []string{"true"}, TimeoutMS: 20000})
		if r.status != 200 {
			t.Fatalf("b's exec after %v of the connection flood: %d %s", time.Since(start).Round(time.Millisecond), r.status, r.body)
		}
		execs++
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), (hold+30)*time.Second)
	defer cancel()
	res := a.attach(ctx, "flood", ss.ID, "", nil)
	_, fds := smp.end()
	out := strings.TrimSpace(string(res.streams["stdout"]))
	t.Logf("flood: %q (stderr %q); b's execs %d; runnerd fds %d before, up to %d during", out, res.streams["stderr"], execs, base, fds)
	var open, failed int
	if _, err := fmt.Sscanf(out, "open %d failed %d", &open, &failed); err != nil {
		t.Fatalf("flood output %q: %v", out, err)
	}
	if open+failed != 20000 || open < limit {
		t.Fatalf("the flood opened %d connections (%d failed): want more than runnerd's %d descriptors", open, failed, limit)
	}
	// Most are closed at accept; a few take a slot freed by a connection
	// that timed out, or are still in the listen queue.
	if got := a.metric("runnerd_dns_tcp_conns_refused_total"); got < float64(open)/2 {
		t.Errorf("runnerd_dns_tcp_conns_refused_total %v, want most of the %d connections", got, open)
	}
	if fds > base+500 {
		t.Errorf("runnerd's descriptors grew from %d to %d during the flood, want a bounded handful", base, fds)
	}
}
