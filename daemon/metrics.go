package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

// metrics are the counters runnerd keeps in memory. The gauges that
// describe sessions are computed at scrape time from the registry and the
// journals, so they are right after a restart too. Written by hand in the
// Prometheus text format: a dozen series do not justify client_golang's
// dependency tree.
type metrics struct {
	attaches        atomic.Int64
	attachesTotal   atomic.Int64
	sessionsStarted atomic.Int64
	errors          map[wire.Code]*atomic.Int64 // fixed at construction; values atomic
}

func newMetrics() *metrics {
	m := &metrics{errors: map[wire.Code]*atomic.Int64{}}
	for _, c := range wire.Codes {
		m.errors[c] = new(atomic.Int64)
	}
	return m
}

func (m *metrics) countError(c wire.Code) {
	if n := m.errors[c]; n != nil {
		n.Add(1)
	}
}

type sessionStats struct {
	sandboxes int
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
		if ss.State != wire.SessionRunning && ss.State != stateStarting {
			continue
		}
		dir := s.sessionDir(ss)
		if ss.State == wire.SessionRunning {
			if sh, err := shim.ReadStatus(dir); err == nil && sh.State == "exited" && sh.Exit != nil {
				st.bytes += total(sh.Exit.Lengths)
				continue
			} else if err == nil && sh.State == "lost" {
				continue
			}
		}
		st.running++
		lengths, _ := journalLengths(dir)
		st.bytes += total(lengths)
	}
	return st, nil
}

// total is the sum of a session's stream lengths.
func total(lengths map[string]int64) int64 {
	var n int64
	for _, l := range lengths {
		n += l
	}
	return n
}

func (s *server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	st, err := s.sessionStats(r.Context())
	if err != nil {
		s.writeError(w, r, errUnavailable("collect metrics: %v", err))
		return
	}
	var b bytes.Buffer
	gauge := func(name, help string, v int64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	counter := func(name, help string, v int64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	gauge("runnerd_sandboxes", "Sandboxes in the registry.", int64(st.sandboxes))
	gauge("runnerd_sessions_running", "Sessions whose command is running.", int64(st.running))
	counter("runnerd_sessions_started_total", "Sessions started by this runnerd process.", s.metrics.sessionsStarted.Load())
	gauge("runnerd_journal_bytes", "Sum of the stream lengths of every session in the registry.", st.bytes)
	gauge("runnerd_attaches", "Attached WebSocket clients.", s.metrics.attaches.Load())
	counter("runnerd_attaches_total", "WebSocket attaches served by this runnerd process.", s.metrics.attachesTotal.Load())
	ws := s.watcher.Stats()
	gauge("runnerd_journal_watches", "Inotify watches held by the shared journal watcher (one per watched directory).", int64(ws.Watches))
	gauge("runnerd_journal_followers", "Follow readers (attaches, streams, execs) woken by the shared journal watcher.", int64(ws.Readers))
	counter("runnerd_journal_watch_overflows_total", "Inotify queue overflows the journal watcher saw (every follower was woken).", int64(ws.Overflows))
	counter("runnerd_journal_poll_fallbacks_total", "Follow readers that fell back to polling.", int64(ws.Fallbacks))
	unavailable := int64(0)
	if ws.Unavailable != nil {
		unavailable = 1
	}
	gauge("runnerd_journal_inotify_unavailable", "1 when the journal watcher has no inotify instance and every follower polls.", unavailable)
	fmt.Fprintf(&b, "# HELP runnerd_errors_total Error responses by code.\n# TYPE runnerd_errors_total counter\n")
	for _, c := range wire.Codes {
		fmt.Fprintf(&b, "runnerd_errors_total{code=%q} %d\n", string(c), s.metrics.errors[c].Load())
	}
	s.writeSandboxUsage(r.Context(), &b)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.Write(b.Bytes())
}

// MaxSandboxSeries caps the sandboxes /metrics reports usage of: each
// costs five series (and five small cgroup file reads per scrape). Past it
// the first MaxSandboxSeries running sandboxes by name are reported and
// runnerd_sandbox_usage_omitted says how many were left out.
const MaxSandboxSeries = 500

// writeSandboxUsage appends the per-sandbox usage series: only running
// sandboxes (a suspended one has no cgroup, a destroyed one no series),
// at most MaxSandboxSeries, so the cardinality is bounded by the cap and
// not by whatever names clients choose. Nothing without cgroups.
func (s *server) writeSandboxUsage(ctx context.Context, b *bytes.Buffer) {
	if s.cg == nil {
		return
	}
	type row struct {
		name string
		u    *wire.Usage
	}
	var rows []row
	omitted, after := 0, ""
	for ctx.Err() == nil {
		sbs, more, err := s.reg.ListSandboxes(after, wire.MaxListLimit)
		if err != nil {
			s.log.Warn("metrics: read registry", "err", err)
			return
		}
		for _, sb := range sbs {
			if sb.State != wire.SandboxRunning {
				continue
			}
			if len(rows) == MaxSandboxSeries {
				omitted++
				continue
			}
			if u := s.usage(sb); u != nil {
				rows = append(rows, row{sb.Name, u})
			}
		}
		if !more || len(sbs) == 0 {
			break
		}
		after = sbs[len(sbs)-1].Name
	}
	series := []struct {
		name, typ, help string
		v               func(*wire.Usage) string
	}{
		{"runnerd_sandbox_memory_bytes", "gauge", "Memory charged to the sandbox's cgroup now.", func(u *wire.Usage) string { return strconv.FormatUint(u.MemoryBytes, 10) }},
		{"runnerd_sandbox_memory_peak_bytes", "gauge", "Most memory charged to the sandbox's cgroup since it was created.", func(u *wire.Usage) string { return strconv.FormatUint(u.MemoryPeakBytes, 10) }},
		{"runnerd_sandbox_cpu_seconds_total", "counter", "CPU time of every process that ran in the sandbox's cgroup.", func(u *wire.Usage) string { return strconv.FormatFloat(float64(u.CPUUsec)/1e6, 'f', 6, 64) }},
		{"runnerd_sandbox_pids", "gauge", "Tasks (processes and threads) in the sandbox's cgroup now.", func(u *wire.Usage) string { return strconv.FormatUint(u.Pids, 10) }},
		{"runnerd_sandbox_oom_kills_total", "counter", "Processes of the sandbox the kernel killed for memory.", func(u *wire.Usage) string { return strconv.FormatUint(u.OOMKills, 10) }},
	}
	for _, m := range series {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.typ)
		for _, r := range rows {
			// Sandbox names are DNS labels: nothing to escape.
			fmt.Fprintf(b, "%s{sandbox=%q} %s\n", m.name, r.name, m.v(r.u))
		}
	}
	fmt.Fprintf(b, "# HELP runnerd_sandbox_usage_omitted Running sandboxes left out of the per-sandbox series (past %d).\n# TYPE runnerd_sandbox_usage_omitted gauge\nrunnerd_sandbox_usage_omitted %d\n", MaxSandboxSeries, omitted)
}
