package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Config sizes a run. The zero value is not useful; start from [Full] or
// [Tiny].
type Config struct {
	// StreamBytes is what the throughput, replay and fan-out sessions
	// write (1 GiB in the full run).
	StreamBytes int64
	// SeekBigBytes is the size of the big journal of the seek figure; the
	// probe cursor is at half of it. SeekSmallBytes and SeekSmallCursor are
	// the baseline journal and its cursor.
	SeekBigBytes, SeekSmallBytes, SeekSmallCursor int64
	// SeekProbes is the number of first-byte probes per journal per round.
	SeekProbes int
	// Calls is the number of exec and of spawn calls per round (and of
	// fork/execs of the baseline), back to back.
	Calls int
	// PacedCalls more of each are made with CallPace before every call
	// and every baseline (0: none).
	PacedCalls int
	CallPace   time.Duration
	// FollowWrites is the number of timestamped writes per follow round,
	// FollowInterval the pause before each (so the reader is blocked).
	FollowWrites   int
	FollowInterval time.Duration
	// FanOut is the number of clients attached to one stream, measured in
	// the first FanOutRounds rounds (0 = every round): 16 clients of a
	// 1 GiB stream read 16 GiB, about a minute per round on 2 cores.
	FanOut, FanOutRounds int
	// Idle lists the idle-session counts at which memory is measured,
	// ascending (100 and 1000 in the full run). IdlePace spaces their
	// spawns (one per IdlePace across the workers), so that starting a
	// thousand processes on two cores does not push the 1-minute load
	// past 2 while the figure is taken (0: as fast as they go).
	Idle     []int
	IdlePace time.Duration
	// ScaleSessions is the number of running sessions in one sandbox for
	// the busy-host figures (list, spawn under load, destroy), and
	// ScaleSandboxes the number of sandboxes listed paged to the end.
	// ScaleProbes is the number of list calls (and raw scans) per round
	// and of spawns for each spawn p50.
	ScaleSessions, ScaleSandboxes, ScaleProbes int
	// Repeat is the number of rounds of every figure but idle memory.
	Repeat int
	// Only, when not empty, limits the run to figures whose group is
	// listed: "stream", "calls", "seek", "follow", "idle", "limits", "scale".
	Only []string
	// TempDir is where the run's temporary directory is made ("" = the
	// system default). The journals and the baseline files live there, so
	// it decides the disk being measured.
	TempDir string
	// ProfileDir, when set, adds a profiled throughput run with an
	// in-process daemon (see profile.go): CPU profiles of daemon+client and
	// of the shim are written there.
	ProfileDir string
	// Cgroups is passed to runnerd as --cgroups ("auto" or "off"); ""
	// keeps runnerd's default (auto: as root on a host with the
	// controllers, every command is placed in its sandbox's cgroups).
	Cgroups string
	// Isolate is passed to runnerd as --isolate ("all" or "none"); ""
	// is "none": the figures in docs/benchmarks.md are of uncontained
	// sandboxes unless a block says otherwise. "all" is the default a
	// root runnerd runs (issue #24), measured beside "none" for the
	// speed issue's figures; only the calls group runs /bin/true alone,
	// which an isolated uid can exec.
	Isolate string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Full is the configuration of the documented run: under ~5 minutes on a
// 2-core machine.
func Full() Config {
	return Config{
		StreamBytes:     1 << 30,
		SeekBigBytes:    4 << 30,
		SeekSmallBytes:  4 << 20,
		SeekSmallCursor: 1 << 20,
		SeekProbes:      200,
		Calls:           500,
		PacedCalls:      100,
		CallPace:        25 * time.Millisecond,
		FollowWrites:    500,
		FollowInterval:  time.Millisecond,
		FanOut:          16,
		FanOutRounds:    1,
		Idle:            []int{100, 1000},
		IdlePace:        60 * time.Millisecond,
		ScaleSessions:   1000,
		ScaleSandboxes:  10000,
		ScaleProbes:     20,
		Repeat:          3,
	}
}

// Tiny is the configuration of TestHarnessTiny: every figure, in seconds.
func Tiny() Config {
	return Config{
		StreamBytes:     4 << 20,
		SeekBigBytes:    8 << 20,
		SeekSmallBytes:  2 << 20,
		SeekSmallCursor: 1 << 20,
		SeekProbes:      5,
		Calls:           5,
		PacedCalls:      3,
		CallPace:        time.Millisecond,
		FollowWrites:    20,
		FollowInterval:  time.Millisecond,
		FanOut:          4,
		Idle:            []int{5},
		ScaleSessions:   8,
		ScaleSandboxes:  12,
		ScaleProbes:     3,
		Repeat:          1,
	}
}

func (cfg Config) wants(group string) bool {
	return len(cfg.Only) == 0 || slices.Contains(cfg.Only, group)
}

// Figure is one measured quantity: its value in every round, its baseline
// in the same rounds (when it has one) and their ratio per round.
type Figure struct {
	Name     string    // what, e.g. "stream throughput"
	Unit     string    // of Value and Baseline, e.g. "MiB/s"
	Value    []float64 // one per round
	Baseline []float64 // one per round, or nil
	BaseName string    // what the baseline is
	// Ratio is Value/Baseline per round (for time, the same: >1 is slower).
	Ratio []float64
	// Target is the target in words; Met says whether the median
	// meets it (nil: report only).
	Target string
	Met    *bool
	Note   string
}

// Report is the result of Run.
type Report struct {
	Config  Config
	Figures []Figure
	// CPU is the CPU time per GiB streamed, by process, for the
	// single-client throughput rounds (daemon, shim, client).
	CPU     map[string][]float64
	Elapsed time.Duration
}

// Figure returns the figure named name, or nil.
func (r *Report) Figure(name string) *Figure {
	for i := range r.Figures {
		if r.Figures[i].Name == name {
			return &r.Figures[i]
		}
	}
	return nil
}

func (r *Report) add(f Figure) { r.Figures = append(r.Figures, f) }

// Stat is the median and spread of a series.
type Stat struct{ Median, Min, Max float64 }

// Summarize returns the median, min and max of v (zeros when empty).
func Summarize(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stat{Median: m, Min: s[0], Max: s[len(s)-1]}
}

func (s Stat) format(prec int) string {
	if s.Min == s.Max {
		return fmt.Sprintf("%.*f", prec, s.Median)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

func precision(v float64) int {
	switch a := math.Abs(v); {
	case a >= 100:
		return 0
	case a >= 10:
		return 1
	case a >= 1:
		return 2
	default:
		return 3
	}
}

// Markdown writes the report as the table docs/benchmarks.md quotes.
func (r *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "| figure | result | baseline | ratio | target |\n| --- | --- | --- | --- | --- |\n")
	for _, f := range r.Figures {
		v := Summarize(f.Value)
		res := v.format(precision(v.Median)) + " " + f.Unit
		base, ratio := "—", "—"
		if f.Baseline != nil {
			b := Summarize(f.Baseline)
			base = b.format(precision(b.Median)) + " " + f.Unit + " (" + f.BaseName + ")"
			rt := Summarize(f.Ratio)
			ratio = rt.format(2) + "×"
		} else if f.BaseName != "" {
			base = f.BaseName
		}
		target := f.Target
		if f.Met != nil {
			if *f.Met {
				target += " — met"
			} else {
				target += " — **missed**"
			}
		}
		if target == "" {
			target = "report"
		}
		name := f.Name
		if f.Note != "" {
			name += " (" + f.Note + ")"
		}
		cell := strings.NewReplacer("|", `\|`).Replace // "head | tee" must not end a cell
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", cell(name), cell(res), cell(base), cell(ratio), cell(target))
	}
	if len(r.CPU) > 0 {
		var parts []string
		for _, k := range []string{"daemon", "shim", "client"} {
			if v, ok := r.CPU[k]; ok {
				parts = append(parts, fmt.Sprintf("%s %s s", k, Summarize(v).format(2)))
			}
		}
		fmt.Fprintf(w, "\nCPU per GiB streamed (single client): %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "\nrounds: %d; elapsed %s\n", r.Config.Repeat, r.Elapsed.Round(time.Second))
}

// ratios returns a[i]/b[i].
func ratios(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] / b[i]
	}
	return out
}

func met(ok bool) *bool { return &ok }

// Run builds runnerd, starts it, measures every figure cfg selects, stops
// the daemon and every session it started, and removes its files.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	start := time.Now()
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Repeat < 1 {
		cfg.Repeat = 1
	}
	dir, err := os.MkdirTemp(cfg.TempDir, "runnerbench-")
	if err != nil {
		return nil, fmt.Errorf("make temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	bins, err := build(ctx, dir, cfg.ProfileDir != "")
	if err != nil {
		return nil, err
	}
	// A freshly built binary's page-cache pages are dirty, and smaps counts
	// dirty file pages as Private_Dirty: write them back before measuring.
	unix.Sync()
	rep := &Report{Config: cfg, CPU: map[string][]float64{}}
	d, err := startDaemon(ctx, dir, bins, cfg.Cgroups, cfg.Isolate)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	h := &harness{cfg: cfg, dir: dir, bins: bins, d: d, rep: rep}
	steps := []struct {
		group string
		run   func(context.Context) error
	}{
		{"stream", h.streams},
		{"calls", h.calls},
		{"seek", h.seek},
		{"follow", h.follow},
		{"idle", h.idle},
		{"limits", h.limits},
		{"scale", h.scale},
	}
	for _, s := range steps {
		if !cfg.wants(s.group) {
			continue
		}
		h.logf("== %s", s.group)
		if err := s.run(ctx); err != nil {
			return rep, fmt.Errorf("%s: %w", s.group, err)
		}
	}
	if cfg.ProfileDir != "" {
		h.logf("== profile")
		if err := profile(ctx, h); err != nil {
			return rep, fmt.Errorf("profile: %w", err)
		}
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// harness is the state of one Run.
type harness struct {
	cfg  Config
	dir  string
	bins binaries
	d    *daemonProc
	rep  *Report
	seq  int
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.Log, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

// name returns a fresh sandbox or session name with prefix.
func (h *harness) name(prefix string) string {
	h.seq++
	return fmt.Sprintf("%s-%d", prefix, h.seq)
}
