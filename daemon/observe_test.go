package daemon_test

import (
	"bytes"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// TestRequestLogLines: every request gets an id in the X-Request-Id
// header, and its one log line carries that id, the route, the sandbox
// and session named in the path, the status, and for a refusal its code
// and reason, with every value the caller quoted (an env entry here)
// redacted. Never the token or a body.
func TestRequestLogLines(t *testing.T) {
	var logs lockedBuffer
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	a.createSandbox("box")
	ok := a.do("POST", "/v1/sandboxes/box/exec", wire.Exec{ID: "e1", Argv: []string{"sh", "-c", "exit 3"}, Env: []string{"TOKEN=SECRET3"}})
	bad := a.do("POST", "/v1/sandboxes/box/sessions", `{"id":"e2","argv":["true"],"env":["NOEQUALS-SECRET2"]}`)
	gone := a.do("GET", "/v1/sandboxes/nope/sessions/x1", nil)

	hexID := regexp.MustCompile(`^[0-9a-f]{16}$`)
	ids := map[string]bool{}
	for _, r := range []response{ok, bad, gone} {
		id := r.header.Get(daemon.HeaderRequestID)
		if !hexID.MatchString(id) || ids[id] {
			t.Fatalf("X-Request-Id %q: want 16 hex digits, unique", id)
		}
		ids[id] = true
	}
	if ok.status != 200 || bad.status != 400 || gone.status != 404 {
		t.Fatalf("statuses %d %d %d, want 200 400 404", ok.status, bad.status, gone.status)
	}
	// The exit is recorded (and "session ended" logged) by a commit made
	// after the exec's answer (deferredCommits): wait for it, bounded.
	ended := `msg="session ended" sandbox=box session=e1 reason=exited code=3`
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), ended) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	out := logs.String()
	for _, want := range []string{
		`msg=request request_id=` + ok.header.Get(daemon.HeaderRequestID) + ` method=POST route="POST /v1/sandboxes/{name}/exec" sandbox=box status=200 duration_ms=`,
		`msg="request refused" request_id=` + bad.header.Get(daemon.HeaderRequestID) + ` method=POST route="POST /v1/sandboxes/{name}/sessions" sandbox=box status=400 duration_ms=`,
		`code=invalid reason="env entry \"…\": want KEY=VALUE"`,
		`msg="request refused" request_id=` + gone.header.Get(daemon.HeaderRequestID) + ` method=GET route="GET /v1/sandboxes/{name}/sessions/{id}" sandbox=nope session=x1 status=404 duration_ms=`,
		`code=not_found reason="sandbox \"…\" does not exist"`,
		`msg="session started" request_id=` + ok.header.Get(daemon.HeaderRequestID) + ` sandbox=box session=e1 pid=`,
		ended,
	} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("log has %d lines with %q, want 1", n, want)
		}
	}
	for _, secret := range []string{"SECRET2", "SECRET3", testToken} {
		if strings.Contains(out, secret) {
			t.Errorf("log contains %q", secret)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

// parseExposition parses an exposition with Prometheus' own parser.
func parseExposition(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse exposition: %v\n%s", err, body)
	}
	return fams
}

// series returns the series of family name whose labels include every
// pair in labels, failing if there is none or the type differs.
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType, labels ...string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	if !ok || f.GetType() != typ {
		t.Fatalf("family %s: got %v (present %v), want %v", name, f.GetType(), ok, typ)
	}
metric:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
			}
			if !found {
				continue metric
			}
		}
		return m
	}
	t.Fatalf("family %s has no series %v", name, labels)
	return nil
}

// TestMetricsOperatorSeries: the latency histograms (API calls by route
// and status, spawn acks, execs), runnerd_build_info, session exits by
// reason and sandboxes by state, with exact counts after known traffic.
func TestMetricsOperatorSeries(t *testing.T) {
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, Version: "dev"})
	a.createSandbox("box")
	a.createSandbox("parked")
	a.must("POST", "/v1/sandboxes/parked/suspend", nil, 200, nil)
	a.exec("box", wire.Exec{ID: "e1", Argv: []string{"sh", "-c", "exit 3"}})
	a.exec("box", wire.Exec{ID: "e2", Argv: []string{"sh", "-c", "kill -9 $$"}})
	a.do("GET", "/v1/sandboxes/nope", nil)

	r := a.do("GET", "/metrics", nil)
	if r.status != 200 {
		t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	fams := parseExposition(t, r.body)
	h := func(name string, labels ...string) uint64 {
		t.Helper()
		return series(t, fams, name, dto.MetricType_HISTOGRAM, labels...).GetHistogram().GetSampleCount()
	}
	for _, c := range []struct {
		name string
		got  uint64
		want uint64
	}{
		{"creates answered 200", h("runnerd_http_request_duration_seconds", "route", "POST /v1/sandboxes", "status", "200"), 2},
		{"execs answered 200", h("runnerd_http_request_duration_seconds", "route", "POST /v1/sandboxes/{name}/exec", "status", "200"), 2},
		{"gets answered 404", h("runnerd_http_request_duration_seconds", "route", "GET /v1/sandboxes/{name}", "status", "404"), 1},
		{"spawn acks", h("runnerd_spawn_ack_seconds"), 2},
		{"execs", h("runnerd_exec_duration_seconds"), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %d observations, want %d", c.name, c.got, c.want)
		}
	}
	gauge := func(name string, labels ...string) float64 {
		t.Helper()
		return series(t, fams, name, dto.MetricType_GAUGE, labels...).GetGauge().GetValue()
	}
	counter := func(name string, labels ...string) float64 {
		t.Helper()
		return series(t, fams, name, dto.MetricType_COUNTER, labels...).GetCounter().GetValue()
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"build info", gauge("runnerd_build_info", "version", "dev"), 1},
		{"running sandboxes", gauge("runnerd_sandboxes_by_state", "state", "running"), 1},
		{"suspended sandboxes", gauge("runnerd_sandboxes_by_state", "state", "suspended"), 1},
		{"exits exited", counter("runnerd_session_exits_total", "reason", "exited"), 1},
		{"exits signaled", counter("runnerd_session_exits_total", "reason", "signaled"), 1},
		{"exits lost", counter("runnerd_session_exits_total", "reason", "lost"), 0},
		{"exits oom_killed", counter("runnerd_session_exits_total", "reason", "oom_killed"), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if gv := series(t, fams, "runnerd_build_info", dto.MetricType_GAUGE).GetLabel(); len(gv) != 3 {
		t.Errorf("runnerd_build_info labels %v, want version, goversion, revision", gv)
	}
}

// TestMetricsListener: --metrics-listen serves /metrics and /healthz
// without the token and nothing else (the API is never reachable there,
// with or without a token), while /metrics on the API listener still
// wants the token.
func TestMetricsListener(t *testing.T) {
	ml, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, MetricsListener: ml})
	a.createSandbox("box")
	m := &api{t: t, base: "http://" + ml.Addr().String(), hc: &http.Client{}, state: a.state}
	r := m.do("GET", "/metrics", nil)
	if r.status != 200 {
		t.Fatalf("metrics listener GET /metrics without a token: %d %s, want 200", r.status, r.body)
	}
	if got := series(t, parseExposition(t, r.body), "runnerd_sandboxes", dto.MetricType_GAUGE).GetGauge().GetValue(); got != 1 {
		t.Errorf("runnerd_sandboxes %v, want 1", got)
	}
	m.must("GET", "/healthz", nil, 200, nil)
	m.wantError(m.do("GET", "/v1/sandboxes", nil), 404, wire.CodeInvalid)
	m.token = testToken
	m.wantError(m.do("DELETE", "/v1/sandboxes/box", nil), 404, wire.CodeInvalid)
	a.must("GET", "/v1/sandboxes/box", nil, 200, nil)
	a.token = ""
	a.wantError(a.do("GET", "/metrics", nil), 401, wire.CodeDenied)
	a.token = testToken
}

// TestMetricsListenAddress: a bare port is on loopback; a named host is
// kept; garbage fails Run before anything is served.
func TestMetricsListenAddress(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"9323", "127.0.0.1:9323"},
		{":9323", "127.0.0.1:9323"},
		{"0.0.0.0:9323", "0.0.0.0:9323"},
		{"[::1]:9323", "[::1]:9323"},
	} {
		got, err := daemon.MetricsAddr(c.in)
		if err != nil || got != c.want {
			t.Errorf("MetricsAddr(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"a:b:c", "host:port", "99999"} {
		if got, err := daemon.MetricsAddr(in); err == nil {
			t.Errorf("MetricsAddr(%q) = %q, want an error", in, got)
		}
	}
}
