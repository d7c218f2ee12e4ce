package bench

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"time"

	"github.com/agentrunner/runner/wire"
)

// callTimes are one pass of calls: execs of /bin/true (request to answer,
// the exit included) and spawns of /bin/true (request to the answer that
// the command runs), each next to a fork/exec from Go: Run for exec
// (start and wait) and Start for spawn (exec'd).
type callTimes struct {
	execs, runs, spawns, starts []time.Duration
}

// callPass makes n calls of each kind in sandbox sb, pausing pause before
// each call and before each baseline (0: back to back). Spawned sessions
// are named prefix-N.
func (h *harness) callPass(ctx context.Context, sb string, n int, pause time.Duration, prefix string) (callTimes, error) {
	var ct callTimes
	wait := func() {
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	for i := range n {
		wait()
		t0 := time.Now()
		res, err := h.d.c.Exec(ctx, sb, wire.Exec{Argv: []string{"/bin/true"}})
		d := time.Since(t0)
		if err != nil {
			return ct, fmt.Errorf("exec %d: %w", i, err)
		}
		if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
			return ct, fmt.Errorf("exec %d: exit %+v, want exited 0", i, res.Exit)
		}
		ct.execs = append(ct.execs, d)

		wait()
		t0 = time.Now()
		if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
			return ct, err
		}
		ct.runs = append(ct.runs, time.Since(t0))
	}
	for i := range n {
		wait()
		t0 := time.Now()
		s, created, err := h.d.c.CreateSession(ctx, sb, wire.CreateSession{ID: fmt.Sprintf("%s-%d", prefix, i), Argv: []string{"/bin/true"}})
		d := time.Since(t0)
		if err != nil {
			return ct, fmt.Errorf("spawn %d: %w", i, err)
		}
		if !created || s.PID == 0 {
			return ct, fmt.Errorf("spawn %d: created %v pid %d, want a new session with a pid", i, created, s.PID)
		}
		ct.spawns = append(ct.spawns, d)

		wait()
		cmd := exec.CommandContext(ctx, "/bin/true")
		t0 = time.Now()
		if err := cmd.Start(); err != nil {
			return ct, err
		}
		ct.starts = append(ct.starts, time.Since(t0))
		cmd.Wait()
	}
	return ct, nil
}

// callFigures accumulates p50 and p99 per round of one kind of pass.
type callFigures struct {
	e50, e99, b50, b99, s50, s99, sb50, sb99 []float64
}

func (f *callFigures) add(ct callTimes) {
	f.e50, f.e99 = append(f.e50, ms(pct(ct.execs, 50))), append(f.e99, ms(pct(ct.execs, 99)))
	f.b50, f.b99 = append(f.b50, ms(pct(ct.runs, 50))), append(f.b99, ms(pct(ct.runs, 99)))
	f.s50, f.s99 = append(f.s50, ms(pct(ct.spawns, 50))), append(f.s99, ms(pct(ct.spawns, 99)))
	f.sb50, f.sb99 = append(f.sb50, ms(pct(ct.starts, 50))), append(f.sb99, ms(pct(ct.starts, 99)))
}

// calls measures, per round, Calls execs and spawns back to back (the
// figures the targets are set on: each spawn also costs the warm shim
// that replaces the one it took, two process starts, whose CPU the next
// calls share), then PacedCalls of each with CallPace before every call
// and every baseline (a rate the warm pool keeps up with, as a control
// plane starting turns would; on a VM the pause also lets idle CPUs
// sleep, which every wake-up then pays for, the baseline's too).
func (h *harness) calls(ctx context.Context) error {
	var b2b, paced callFigures
	for round := range h.cfg.Repeat {
		sb, err := h.newSandbox(ctx, "calls")
		if err != nil {
			return err
		}
		ct, err := h.callPass(ctx, sb, h.cfg.Calls, 0, "spawn")
		if err != nil {
			return err
		}
		b2b.add(ct)
		h.logf("round %d: exec p50 %.2f p99 %.2f ms (fork/exec %.2f %.2f); spawn p50 %.2f p99 %.2f ms (start %.2f %.2f)",
			round+1, b2b.e50[round], b2b.e99[round], b2b.b50[round], b2b.b99[round], b2b.s50[round], b2b.s99[round], b2b.sb50[round], b2b.sb99[round])
		if h.cfg.PacedCalls > 0 {
			ct, err := h.callPass(ctx, sb, h.cfg.PacedCalls, h.cfg.CallPace, "paced")
			if err != nil {
				return err
			}
			paced.add(ct)
			h.logf("round %d, one call per %v: exec p50 %.2f ms (fork/exec %.2f); spawn p50 %.2f ms (start %.2f)",
				round+1, h.cfg.CallPace, paced.e50[round], paced.b50[round], paced.s50[round], paced.sb50[round])
		}
		h.dropSandbox(ctx, sb)
	}
	calls := fmt.Sprintf("/bin/true, %d calls back to back", h.cfg.Calls)
	r := ratios(b2b.e50, b2b.b50)
	h.rep.add(Figure{Name: "exec round trip p50", Note: calls, Unit: "ms", Value: b2b.e50, Baseline: b2b.b50,
		BaseName: "exec.Cmd.Run", Ratio: r, Target: "≤ 4×", Met: met(Summarize(r).Median <= 4)})
	h.rep.add(Figure{Name: "exec round trip p99", Note: calls, Unit: "ms", Value: b2b.e99, Baseline: b2b.b99,
		BaseName: "exec.Cmd.Run", Ratio: ratios(b2b.e99, b2b.b99)})
	r = ratios(b2b.s50, b2b.sb50)
	h.rep.add(Figure{Name: "spawn ack p50", Note: calls, Unit: "ms", Value: b2b.s50, Baseline: b2b.sb50,
		BaseName: "exec.Cmd.Start", Ratio: r, Target: "≤ 3×", Met: met(Summarize(r).Median <= 3)})
	h.rep.add(Figure{Name: "spawn ack p99", Note: calls, Unit: "ms", Value: b2b.s99, Baseline: b2b.sb99,
		BaseName: "exec.Cmd.Start", Ratio: ratios(b2b.s99, b2b.sb99)})
	if h.cfg.PacedCalls > 0 {
		calls := fmt.Sprintf("/bin/true, %d calls, one per %v", h.cfg.PacedCalls, h.cfg.CallPace)
		h.rep.add(Figure{Name: "exec round trip p50, paced", Note: calls, Unit: "ms", Value: paced.e50, Baseline: paced.b50,
			BaseName: "exec.Cmd.Run, paced alike", Ratio: ratios(paced.e50, paced.b50)})
		h.rep.add(Figure{Name: "spawn ack p50, paced", Note: calls, Unit: "ms", Value: paced.s50, Baseline: paced.sb50,
			BaseName: "exec.Cmd.Start, paced alike", Ratio: ratios(paced.s50, paced.sb50)})
	}
	return nil
}

// pct returns the p-th percentile (nearest rank) of d.
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
