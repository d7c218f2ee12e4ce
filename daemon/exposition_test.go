package daemon_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentrunner/runner/wire"
)

// TestMetricsExposition parses /metrics with Prometheus' own text parser:
// every family has one type (the attach gauge and counter no longer share
// the family runnerd_attaches), the process and Go runtime series are
// there, and the daemon's series keep their names and values.
func TestMetricsExposition(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	live := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	conn := dialAttach(t, ctxFor(t, 30*time.Second), a, "box", live.ID)
	defer conn.Close(websocket.StatusNormalClosure, "")
	a.do("GET", "/v1/sandboxes/nope", nil)

	var r response
	deadline := time.Now().Add(10 * time.Second)
	for {
		r = a.do("GET", "/metrics", nil)
		if bytes.Contains(r.body, []byte("runnerd_attaches 1\n")) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("got %d %q", r.status, r.header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("parse exposition: %v\n%s", err, r.body)
	}
	// OpenMetrics names a counter's family without _total: no gauge of
	// runnerd's may hold the name a counter's family has. (client_golang's
	// own go_memstats_alloc_bytes{,_total} do; not ours to rename.)
	for name, f := range fams {
		if strings.HasPrefix(name, "runnerd_") && f.GetType() == dto.MetricType_COUNTER {
			if g, ok := fams[strings.TrimSuffix(name, "_total")]; ok && g != f {
				t.Errorf("counter %s and %s %s share a family", name, g.GetType(), g.GetName())
			}
		}
	}
	value := func(name string, typ dto.MetricType, labels ...string) float64 {
		t.Helper()
		m := series(t, fams, name, typ, labels...) // observe_test.go
		if typ == dto.MetricType_COUNTER {
			return m.GetCounter().GetValue()
		}
		return m.GetGauge().GetValue()
	}
	for _, tc := range []struct {
		name   string
		typ    dto.MetricType
		labels []string
		want   float64
	}{
		{"runnerd_sandboxes", dto.MetricType_GAUGE, nil, 1},
		{"runnerd_sessions_running", dto.MetricType_GAUGE, nil, 1},
		{"runnerd_sessions_started_total", dto.MetricType_COUNTER, nil, 1},
		{"runnerd_attaches", dto.MetricType_GAUGE, nil, 1},
		{"runnerd_attaches_served_total", dto.MetricType_COUNTER, nil, 1},
		{"runnerd_errors_total", dto.MetricType_COUNTER, []string{"code", "not_found"}, 1},
		{"runnerd_errors_total", dto.MetricType_COUNTER, []string{"code", "provider"}, 0},
	} {
		if got := value(tc.name, tc.typ, tc.labels...); got != tc.want {
			t.Errorf("%s%v: got %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if n := len(fams["runnerd_errors_total"].GetMetric()); n != len(wire.Codes) {
		t.Errorf("runnerd_errors_total: %d series, want one per code (%d)", n, len(wire.Codes))
	}
	for _, name := range []string{"runnerd_journal_watches", "runnerd_journal_followers", "runnerd_journal_bytes", "runnerd_journal_inotify_unavailable"} {
		value(name, dto.MetricType_GAUGE)
	}
	for _, name := range []string{"runnerd_journal_watch_overflows_total", "runnerd_journal_poll_fallbacks_total"} {
		value(name, dto.MetricType_COUNTER)
	}
	// The process's and the Go runtime's own series.
	if v := value("process_open_fds", dto.MetricType_GAUGE); v < 1 {
		t.Errorf("process_open_fds %v", v)
	}
	value("process_resident_memory_bytes", dto.MetricType_GAUGE)
	value("process_cpu_seconds_total", dto.MetricType_COUNTER)
	if v := value("go_goroutines", dto.MetricType_GAUGE); v < 1 {
		t.Errorf("go_goroutines %v", v)
	}
	if _, ok := fams["go_gc_duration_seconds"]; !ok {
		t.Error("no go_gc_duration_seconds")
	}
}
