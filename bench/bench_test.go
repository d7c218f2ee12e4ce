package bench_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/bench"
)

// TestHarnessTiny runs the whole harness once at a tiny size, with the
// profile run, so CI exercises every figure. It checks that every figure
// was produced with a positive value (and baseline and ratio where it has
// one), never how fast anything was.
func TestHarnessTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts runnerd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log bytes.Buffer
	cfg := bench.Tiny()
	cfg.TempDir = t.TempDir()
	cfg.ProfileDir = t.TempDir()
	cfg.Log = &log
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\nlog:\n%s", err, log.String())
	}
	want := []string{
		"stream throughput", "stream throughput, raw WebSocket reader", "attach replay", "attach replay, WebSocket", "attach replay, raw WebSocket reader", "fan-out aggregate",
		"exec round trip p50", "exec round trip p99", "spawn ack p50", "spawn ack p99",
		"exec round trip p50, paced", "spawn ack p50, paced",
		"seek: time to first byte p50", "follow latency p50", "follow latency p99",
		"idle cost per session, Pss, 5 sessions", "idle cost per session, Private_Dirty, 5 sessions",
	}
	if strings.Contains(log.String(), "limits: skipped") {
		t.Logf("SKIP the limits figures: runnerd does not advertise resource_limits here (not root, or no cgroup controllers)")
	} else {
		want = append(want, "exec p50 beside a fork bomb at pids 64", "exec p50 beside 2 CPU hogs under a 50000 us/100 ms quota",
			"exec p50 beside 2 CPU hogs without a quota (control)")
	}
	for _, name := range want {
		f := rep.Figure(name)
		if f == nil {
			t.Errorf("figure %q missing", name)
			continue
		}
		if len(f.Value) == 0 || (len(f.Value) != cfg.Repeat && !strings.HasPrefix(name, "idle") && name != "fan-out aggregate") {
			t.Errorf("%s: got %d values, want %d", name, len(f.Value), cfg.Repeat)
		}
		for _, v := range f.Value {
			if !(v > 0) {
				t.Errorf("%s: value %v, want > 0", name, v)
			}
		}
		if f.Baseline != nil {
			for i := range f.Baseline {
				if !(f.Baseline[i] > 0) || !(f.Ratio[i] > 0) {
					t.Errorf("%s: baseline %v ratio %v, want > 0", name, f.Baseline[i], f.Ratio[i])
				}
			}
		}
	}
	if got := len(rep.Figures); got != len(want) {
		t.Errorf("got %d figures, want %d", got, len(want))
	}
	for _, k := range []string{"daemon", "shim", "client"} {
		if v := rep.CPU[k]; len(v) != cfg.Repeat {
			t.Errorf("CPU[%s]: got %d samples, want %d", k, len(v), cfg.Repeat)
		}
	}
	for _, p := range []string{"live.pprof", "replay.pprof", "shim-*.pprof"} {
		if m, _ := filepath.Glob(filepath.Join(cfg.ProfileDir, p)); len(m) == 0 {
			t.Errorf("profile %s not written", p)
		}
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	if !strings.Contains(md.String(), "| stream throughput") {
		t.Errorf("Markdown lacks the stream throughput row:\n%s", md.String())
	}
}

// TestSummarize checks the median and spread the report quotes.
func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want bench.Stat
	}{
		{"empty", nil, bench.Stat{}},
		{"one", []float64{3}, bench.Stat{Median: 3, Min: 3, Max: 3}},
		{"odd", []float64{5, 1, 3}, bench.Stat{Median: 3, Min: 1, Max: 5}},
		{"even", []float64{4, 1, 3, 2}, bench.Stat{Median: 2.5, Min: 1, Max: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := bench.Summarize(tt.in); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
