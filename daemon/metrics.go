package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// metrics are the counters runnerd keeps in memory, and the registry of
// the collectors that do not depend on a scrape (the process's and the Go
// runtime's). The gauges that describe sessions are computed at scrape
// time from the registry and the journals, so they are right after a
// restart too.
//
// The exposition is client_golang's: it used to be written by hand, which
// was fine for a dozen series but made adding the process and Go runtime
// series (descriptors, CPU, memory, GC) a reimplementation, and let a
// gauge and a counter share one family (runnerd_attaches and
// runnerd_attaches_total) unnoticed. The series names are unchanged except
// that counter, now runnerd_attaches_served_total.
type metrics struct {
	attaches        atomic.Int64
	attachesTotal   atomic.Int64
	sessionsStarted atomic.Int64
	// sessionsCollected counts the ended sessions deleted because their
	// sandbox kept more than --sandbox-max-ended-sessions (sessions_cap.go).
	sessionsCollected atomic.Int64
	errors            map[wire.Code]*atomic.Int64 // fixed at construction; values atomic
	static            *prometheus.Registry        // process and Go runtime collectors, the histograms
	ckpt              checkpointMetrics           // checkpoints.go; registered in static

	requests *prometheus.HistogramVec // by route and status; seconds to the response header
	spawnAck prometheus.Histogram     // seconds from spawn to the shim's readiness
	exec     prometheus.Histogram     // seconds from an exec's request to its result
	exits    *prometheus.CounterVec   // sessions this runnerd saw end, by reason
}

// latencyBuckets run from 0.5 ms to ~33 s, doubling: a warm spawn acks in
// about a millisecond, a cold one in tens, a slow disk makes seconds.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 17)

func newMetrics(version string) *metrics {
	m := &metrics{errors: map[wire.Code]*atomic.Int64{}, static: prometheus.NewRegistry()}
	for _, c := range wire.Codes {
		m.errors[c] = new(atomic.Int64)
	}
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "runnerd_http_request_duration_seconds",
		Help:    "API requests by route (the mux pattern) and status: seconds until the response header (an attach's upgrade, a stream's first byte).",
		Buckets: latencyBuckets,
	}, []string{"route", "status"})
	m.spawnAck = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "runnerd_spawn_ack_seconds",
		Help:    "Session starts that succeeded (spawns and execs): seconds from the spawn's start to the shim's readiness (the command running).",
		Buckets: latencyBuckets,
	})
	m.exec = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "runnerd_exec_duration_seconds",
		Help:    "Execs answered with a result: seconds from the request to the answer (start, run, output).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
	})
	m.exits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runnerd_session_exits_total",
		Help: "Sessions this runnerd process recorded as ended, by reason.",
	}, []string{"reason"})
	for _, r := range exitReasons {
		m.exits.WithLabelValues(r) // every reason present from the start, at 0
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "runnerd_build_info",
		Help:        "Always 1; the labels name this runnerd's build.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version(), "revision": buildRevision()},
	})
	build.Set(1)
	m.static.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector(),
		m.requests, m.spawnAck, m.exec, m.exits, build)
	m.ckpt = newCheckpointMetrics(m.static)
	return m
}

// buildRevision is the VCS revision the binary was built from, or "".
func buildRevision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}

// exitReasons are the values of runnerd_session_exits_total's reason: the
// exit record's, with an OOM kill (signaled, oom_killed set) apart, so the
// reasons still sum to every ended session.
var exitReasons = []string{wire.ExitExited, wire.ExitSignaled, "oom_killed", wire.ExitLost}

// countExit counts one session's end by its reason.
func (m *metrics) countExit(e *wire.Exit) {
	reason := e.Reason
	if e.OOMKilled {
		reason = "oom_killed"
	}
	m.exits.WithLabelValues(reason).Inc()
}

func (m *metrics) observeRequest(route string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Observe(d.Seconds())
}

func (m *metrics) countError(c wire.Code) {
	if n := m.errors[c]; n != nil {
		n.Add(1)
	}
}

type sessionStats struct {
	sandboxes int
	byState   map[string]int
	running   int
	bytes     int64
}

// sessionStats reads the registry without refreshing it: a scrape is a GET
// and writes nothing, and an ended session's record already holds its
// lengths. Only sessions the registry still calls running (or starting)
// are looked at further, through the shim's status files (reads, no
// registry write): one that has exited or lost its shim is not counted as
// running, and the next request that touches it records that.
func (s *server) sessionStats(ctx context.Context) (sessionStats, error) {
	var st sessionStats
	n, err := s.reg.CountSandboxes()
	if err != nil {
		return st, err
	}
	st.sandboxes = n
	if st.byState, err = s.sandboxesByState(ctx); err != nil {
		return st, err
	}
	all, err := s.reg.AllSessions()
	if err != nil {
		return st, err
	}
	for _, ss := range all {
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		if ss.Exit != nil {
			st.bytes += total(ss.Exit.Lengths)
			continue
		}
		if ss.State != wire.SessionRunning && ss.State != sessions.StateStarting {
			continue
		}
		dir := s.ssn.Dir(ss)
		if ss.State == wire.SessionRunning {
			if sh, err := sessiondir.ReadStatus(dir); err == nil && sh.State == "exited" && sh.Exit != nil {
				st.bytes += total(sh.Exit.Lengths)
				continue
			} else if err == nil && sh.State == "lost" {
				continue
			}
		}
		st.running++
		lengths, _ := sessions.JournalLengths(dir)
		st.bytes += total(lengths)
	}
	return st, nil
}

// sandboxesByState counts the registry's sandboxes by state, a page at a
// time; a failed page fails the scrape (never a short count).
func (s *server) sandboxesByState(ctx context.Context) (map[string]int, error) {
	n := map[string]int{}
	if err := s.sbx.Each(ctx, func(sb registry.Sandbox) { n[sb.State]++ }); err != nil {
		return nil, err
	}
	return n, nil
}

// total is the sum of a session's stream lengths.
func total(lengths map[string]int64) int64 {
	var n int64
	for _, l := range lengths {
		n += l
	}
	return n
}

// scrape is the collector of one scrape: the series read from runnerd's
// state, with the session stats already computed (an error there is a
// 503, before anything is gathered). It is unchecked (Describe sends
// nothing): its series depend on the sandboxes running.
type scrape struct {
	s   *server
	ctx context.Context
	st  sessionStats
}

func (sc *scrape) Describe(chan<- *prometheus.Desc) {}

func (sc *scrape) Collect(ch chan<- prometheus.Metric) {
	s, st := sc.s, sc.st
	gauge := func(name, help string, v float64) {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, v)
	}
	counter := func(name, help string, v float64) {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, v)
	}
	gauge("runnerd_sandboxes", "Sandboxes in the registry.", float64(st.sandboxes))
	byState := prometheus.NewDesc("runnerd_sandboxes_by_state", "Sandboxes in the registry by state.", []string{"state"}, nil)
	for _, state := range []string{wire.SandboxRunning, wire.SandboxSuspended} {
		ch <- prometheus.MustNewConstMetric(byState, prometheus.GaugeValue, float64(st.byState[state]), state)
	}
	gauge("runnerd_sessions_running", "Sessions whose command is running.", float64(st.running))
	counter("runnerd_sessions_started_total", "Sessions started by this runnerd process.", float64(s.metrics.sessionsStarted.Load()))
	counter("runnerd_sessions_collected_total", "Ended sessions this runnerd process deleted because their sandbox kept more than --sandbox-max-ended-sessions (the oldest go first).", float64(s.metrics.sessionsCollected.Load()))
	gauge("runnerd_journal_bytes", "Sum of the stream lengths of every session in the registry.", float64(st.bytes))
	gauge("runnerd_attaches", "Attached WebSocket clients.", float64(s.metrics.attaches.Load()))
	counter("runnerd_attaches_served_total", "WebSocket attaches served by this runnerd process.", float64(s.metrics.attachesTotal.Load()))
	ws := s.ssn.Watcher().Stats()
	gauge("runnerd_journal_watches", "Inotify watches held by the shared journal watcher (one per watched directory).", float64(ws.Watches))
	gauge("runnerd_journal_followers", "Follow readers (attaches, streams, execs) woken by the shared journal watcher.", float64(ws.Readers))
	counter("runnerd_journal_watch_overflows_total", "Inotify queue overflows the journal watcher saw (every follower was woken).", float64(ws.Overflows))
	counter("runnerd_journal_poll_fallbacks_total", "Follow readers that fell back to polling.", float64(ws.Fallbacks))
	unavailable := 0.0
	if ws.Unavailable != nil {
		unavailable = 1
	}
	gauge("runnerd_journal_inotify_unavailable", "1 when the journal watcher has no inotify instance and every follower polls.", unavailable)
	errDesc := prometheus.NewDesc("runnerd_errors_total", "Error responses by code.", []string{"code"}, nil)
	for _, c := range wire.Codes {
		ch <- prometheus.MustNewConstMetric(errDesc, prometheus.CounterValue, float64(s.metrics.errors[c].Load()), string(c))
	}
	s.collectSandboxUsage(sc.ctx, ch)
	s.sbx.CollectNetStats(ch) // network.go
}

func (s *server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	st, err := s.sessionStats(r.Context())
	if err != nil {
		s.writeError(w, r, apierr.Unavailable("collect metrics: %v", err))
		return
	}
	scrapeReg := prometheus.NewPedanticRegistry()
	if err := scrapeReg.Register(&scrape{s: s, ctx: r.Context(), st: st}); err != nil {
		s.writeError(w, r, apierr.Unavailable("collect metrics: %v", err))
		return
	}
	mfs, err := prometheus.Gatherers{s.metrics.static, scrapeReg}.Gather()
	if err != nil {
		s.writeError(w, r, apierr.Unavailable("collect metrics: %v", err))
		return
	}
	var b bytes.Buffer
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	enc := expfmt.NewEncoder(&b, format)
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			s.writeError(w, r, apierr.Unavailable("encode metrics: %v", err))
			return
		}
	}
	w.Header().Set("Content-Type", string(format))
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.Write(b.Bytes())
}

// MaxSandboxSeries caps the sandboxes /metrics reports usage of: each
// costs five series (and five small cgroup file reads per scrape). Past it
// the first MaxSandboxSeries running sandboxes by name are reported and
// runnerd_sandbox_usage_omitted says how many were left out.
const MaxSandboxSeries = 500

// collectSandboxUsage sends the per-sandbox usage series: only running
// sandboxes (a suspended one has no cgroup, a destroyed one no series),
// at most MaxSandboxSeries, so the cardinality is bounded by the cap and
// not by whatever names clients choose. Nothing without cgroups.
func (s *server) collectSandboxUsage(ctx context.Context, ch chan<- prometheus.Metric) {
	if s.sbx.Cgroups() == nil {
		return
	}
	type row struct {
		name string
		u    *wire.Usage
	}
	var rows []row
	omitted := 0
	err := s.sbx.Each(ctx, func(sb registry.Sandbox) {
		if sb.State != wire.SandboxRunning {
			return
		}
		if len(rows) == MaxSandboxSeries {
			omitted++
			return
		}
		if u := s.sbx.Usage(sb); u != nil {
			rows = append(rows, row{sb.Name, u})
		}
	})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("metrics: read registry", "err", err)
		return
	}
	series := []struct {
		name string
		typ  prometheus.ValueType
		help string
		v    func(*wire.Usage) float64
	}{
		{"runnerd_sandbox_memory_bytes", prometheus.GaugeValue, "Memory charged to the sandbox's cgroup now.", func(u *wire.Usage) float64 { return float64(u.MemoryBytes) }},
		{"runnerd_sandbox_memory_peak_bytes", prometheus.GaugeValue, "Most memory charged to the sandbox's cgroup since it was created.", func(u *wire.Usage) float64 { return float64(u.MemoryPeakBytes) }},
		{"runnerd_sandbox_cpu_seconds_total", prometheus.CounterValue, "CPU time of every process that ran in the sandbox's cgroup.", func(u *wire.Usage) float64 { return float64(u.CPUUsec) / 1e6 }},
		{"runnerd_sandbox_pids", prometheus.GaugeValue, "Tasks (processes and threads) in the sandbox's cgroup now.", func(u *wire.Usage) float64 { return float64(u.Pids) }},
		{"runnerd_sandbox_oom_kills_total", prometheus.CounterValue, "Processes of the sandbox the kernel killed for memory.", func(u *wire.Usage) float64 { return float64(u.OOMKills) }},
	}
	for _, m := range series {
		desc := prometheus.NewDesc(m.name, m.help, []string{"sandbox"}, nil)
		for _, r := range rows {
			ch <- prometheus.MustNewConstMetric(desc, m.typ, m.v(r.u), r.name)
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("runnerd_sandbox_usage_omitted",
		fmt.Sprintf("Running sandboxes left out of the per-sandbox series (past %d).", MaxSandboxSeries), nil, nil),
		prometheus.GaugeValue, float64(omitted))
}

// checkpointMetrics are the checkpoint series of /metrics.
type checkpointMetrics struct {
	created, restored prometheus.Histogram
	frozen            prometheus.Histogram
	stored            prometheus.Counter
}

func newCheckpointMetrics(reg *prometheus.Registry) checkpointMetrics {
	buckets := []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := checkpointMetrics{
		created: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnerd_checkpoint_duration_seconds",
			Help: "Time to make a checkpoint, freeze included.", Buckets: buckets}),
		restored: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnerd_restore_duration_seconds",
			Help: "Time to restore a checkpoint (staging and swap; not the park and resume around it).", Buckets: buckets}),
		frozen: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnerd_checkpoint_frozen_seconds",
			Help: "Time a sandbox's processes were frozen for a checkpoint.", Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30}}),
		stored: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnerd_checkpoint_stored_bytes_total",
			Help: "Bytes checkpoints added to their stores (compressed chunks not stored before, and snapshots)."}),
	}
	reg.MustRegister(m.created, m.restored, m.frozen, m.stored)
	return m
}

func (m *metrics) ObserveCheckpoint(d, frozen time.Duration, stored int64) {
	m.ckpt.created.Observe(d.Seconds())
	m.ckpt.frozen.Observe(frozen.Seconds())
	m.ckpt.stored.Add(float64(stored))
}

func (m *metrics) ObserveRestore(d time.Duration) { m.ckpt.restored.Observe(d.Seconds()) }

// SessionStarted counts a started session and its spawn's ack latency
// (sessions.Metrics).
func (m *metrics) SessionStarted(ack time.Duration) {
	m.sessionsStarted.Add(1)
	m.spawnAck.Observe(ack.Seconds())
}

// SessionCollected counts an ended session the collector deleted.
func (m *metrics) SessionCollected() { m.sessionsCollected.Add(1) }

// SessionEnded counts a session's end by its reason.
func (m *metrics) SessionEnded(e *wire.Exit) { m.countExit(e) }
