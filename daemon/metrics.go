package daemon

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/agentrunner/runner/wire"
)

// metrics are the counters runnerd keeps in memory. The gauges that
// describe sessions are computed at scrape time from the registry and the
// journals, so they are right after a restart too. Written by hand in the
// Prometheus text format: five series do not justify client_golang's
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
	fmt.Fprintf(&b, "# HELP runnerd_errors_total Error responses by code.\n# TYPE runnerd_errors_total counter\n")
	for _, c := range wire.Codes {
		fmt.Fprintf(&b, "runnerd_errors_total{code=%q} %d\n", string(c), s.metrics.errors[c].Load())
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.Write(b.Bytes())
}
