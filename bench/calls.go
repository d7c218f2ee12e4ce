package bench

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"time"

	"github.com/agentrunner/runner/wire"
)

// calls measures, per round, Calls execs of /bin/true (request to answer,
// the exit included) and Calls spawns of /bin/true (request to the answer
// that the command runs), each next to Calls fork/execs from Go: Run for
// exec (start and wait) and Start for spawn (exec'd).
func (h *harness) calls(ctx context.Context) error {
	n := h.cfg.Calls
	var e50, e99, b50, b99, s50, s99, sb50, sb99 []float64
	for round := range h.cfg.Repeat {
		sb, err := h.newSandbox(ctx, "calls")
		if err != nil {
			return err
		}
		var execs, runs, spawns, starts []time.Duration
		for i := range n {
			t0 := time.Now()
			res, err := h.d.c.Exec(ctx, sb, wire.Exec{Argv: []string{"/bin/true"}})
			d := time.Since(t0)
			if err != nil {
				return fmt.Errorf("exec %d: %w", i, err)
			}
			if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
				return fmt.Errorf("exec %d: exit %+v, want exited 0", i, res.Exit)
			}
			execs = append(execs, d)

			t0 = time.Now()
			if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
				return err
			}
			runs = append(runs, time.Since(t0))
		}
		for i := range n {
			t0 := time.Now()
			s, created, err := h.d.c.CreateSession(ctx, sb, wire.CreateSession{ID: fmt.Sprintf("spawn-%d", i), Argv: []string{"/bin/true"}})
			d := time.Since(t0)
			if err != nil {
				return fmt.Errorf("spawn %d: %w", i, err)
			}
			if !created || s.PID == 0 {
				return fmt.Errorf("spawn %d: created %v pid %d, want a new session with a pid", i, created, s.PID)
			}
			spawns = append(spawns, d)

			cmd := exec.CommandContext(ctx, "/bin/true")
			t0 = time.Now()
			if err := cmd.Start(); err != nil {
				return err
			}
			starts = append(starts, time.Since(t0))
			cmd.Wait()
		}
		h.dropSandbox(ctx, sb)
		e50, e99 = append(e50, ms(pct(execs, 50))), append(e99, ms(pct(execs, 99)))
		b50, b99 = append(b50, ms(pct(runs, 50))), append(b99, ms(pct(runs, 99)))
		s50, s99 = append(s50, ms(pct(spawns, 50))), append(s99, ms(pct(spawns, 99)))
		sb50, sb99 = append(sb50, ms(pct(starts, 50))), append(sb99, ms(pct(starts, 99)))
		h.logf("round %d: exec p50 %.2f p99 %.2f ms (fork/exec %.2f %.2f); spawn p50 %.2f p99 %.2f ms (start %.2f %.2f)",
			round+1, e50[round], e99[round], b50[round], b99[round], s50[round], s99[round], sb50[round], sb99[round])
	}
	calls := fmt.Sprintf("/bin/true, %d calls", n)
	r := ratios(e50, b50)
	h.rep.add(Figure{Name: "exec round trip p50", Note: calls, Unit: "ms", Value: e50, Baseline: b50,
		BaseName: "exec.Cmd.Run", Ratio: r, Target: "≤ 4×", Met: met(Summarize(r).Median <= 4)})
	h.rep.add(Figure{Name: "exec round trip p99", Note: calls, Unit: "ms", Value: e99, Baseline: b99,
		BaseName: "exec.Cmd.Run", Ratio: ratios(e99, b99)})
	r = ratios(s50, sb50)
	h.rep.add(Figure{Name: "spawn ack p50", Note: calls, Unit: "ms", Value: s50, Baseline: sb50,
		BaseName: "exec.Cmd.Start", Ratio: r, Target: "≤ 3×", Met: met(Summarize(r).Median <= 3)})
	h.rep.add(Figure{Name: "spawn ack p99", Note: calls, Unit: "ms", Value: s99, Baseline: sb99,
		BaseName: "exec.Cmd.Start", Ratio: ratios(s99, sb99)})
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
