package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentrunner/runner/wire"
)

// Noisy neighbours (group "limits"): exec latency in one sandbox while
// another sandbox runs a fork bomb held at its pids limit, or CPU hogs held
// by a CPU quota, against the same execs on an otherwise idle host,
// measured in the same round. Needs resource_limits (root); without it the
// group is skipped with a log line, never measured unbounded.

// Limits of the noisy sandboxes.
const (
	bombPids      = 64
	hogQuotaUS    = 50000 // half a core per 100 ms
	hogProcs      = 2     // hogs: as many as this machine's cores
	neighbourWarm = 300 * time.Millisecond
)

func (h *harness) limits(ctx context.Context) error {
	caps, err := h.d.c.Capabilities(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(caps, wire.CapResourceLimits) {
		h.logf("limits: skipped, %s not advertised (not root?)", wire.CapResourceLimits)
		return nil
	}
	n := min(h.cfg.Calls, 200)
	var idle, bomb, hog, free []float64
	var bombLoads, hogLoads, freeLoads []string
	for round := range h.cfg.Repeat {
		calm, err := h.newSandbox(ctx, "calm")
		if err != nil {
			return err
		}
		p50, err := h.execP50(ctx, calm, n)
		if err != nil {
			return err
		}
		idle = append(idle, p50)

		// A fork bomb at its limit: the loop forks as fast as the kernel
		// refuses it (stderr discarded: the refusals are the point).
		p50, load, err := h.beside(ctx, calm, n, wire.Limits{Pids: bombPids},
			"while :; do sleep 5 & done 2>/dev/null", func(u *wire.Usage) bool { return u.Pids >= bombPids-2 })
		if err != nil {
			return err
		}
		bomb = append(bomb, p50)
		bombLoads = append(bombLoads, load)

		hogs := strings.Repeat("while :; do :; done & ", hogProcs) + "wait"
		p50, load, err = h.beside(ctx, calm, n, wire.Limits{CPUQuotaUS: hogQuotaUS},
			hogs, func(u *wire.Usage) bool { return u.CPUUsec > 0 })
		if err != nil {
			return err
		}
		hog = append(hog, p50)
		hogLoads = append(hogLoads, load)

		// The control: the same hogs with no quota (weight alone).
		p50, load, err = h.beside(ctx, calm, n, wire.Limits{},
			hogs, func(u *wire.Usage) bool { return u.CPUUsec > 0 })
		if err != nil {
			return err
		}
		free = append(free, p50)
		freeLoads = append(freeLoads, load)
		h.logf("round %d: exec p50 idle %.2f ms, beside a fork bomb %.2f ms, beside CPU hogs %.2f ms (%.2f ms without a quota)", round+1, idle[round], bomb[round], hog[round], free[round])
		h.dropSandbox(ctx, calm)
	}
	note := func(loads []string) string {
		return fmt.Sprintf("/bin/true, %d calls; load average at the end of each round: %s", n, strings.Join(loads, "; "))
	}
	h.rep.add(Figure{Name: "exec p50 beside a fork bomb at pids " + fmt.Sprint(bombPids), Note: note(bombLoads), Unit: "ms",
		Value: bomb, Baseline: idle, BaseName: "same execs, idle host", Ratio: ratios(bomb, idle)})
	h.rep.add(Figure{Name: fmt.Sprintf("exec p50 beside %d CPU hogs under a %d us/100 ms quota", hogProcs, hogQuotaUS), Note: note(hogLoads), Unit: "ms",
		Value: hog, Baseline: idle, BaseName: "same execs, idle host", Ratio: ratios(hog, idle)})
	h.rep.add(Figure{Name: fmt.Sprintf("exec p50 beside %d CPU hogs without a quota (control)", hogProcs), Note: note(freeLoads), Unit: "ms",
		Value: free, Baseline: idle, BaseName: "same execs, idle host", Ratio: ratios(free, idle)})
	return nil
}

// beside starts script in a new sandbox with limits l, waits until ready
// says its usage shows it at work, measures n execs in calm, and destroys
// the noisy sandbox. It returns the p50 in ms and /proc/loadavg's first
// three fields read at the end.
func (h *harness) beside(ctx context.Context, calm string, n int, l wire.Limits, script string, ready func(*wire.Usage) bool) (float64, string, error) {
	name := h.name("noisy")
	if _, err := h.d.c.CreateSandbox(ctx, wire.CreateSandbox{Name: name, Limits: &l}); err != nil {
		return 0, "", fmt.Errorf("create sandbox %s: %w", name, err)
	}
	defer h.dropSandbox(ctx, name)
	if _, _, err := h.d.c.CreateSession(ctx, name, wire.CreateSession{Argv: []string{"sh", "-c", script}}); err != nil {
		return 0, "", fmt.Errorf("start neighbour: %w", err)
	}
	// Short: a neighbour that does not show in its usage is not in its
	// cgroup, and is stopped (the deferred destroy) before it does harm.
	deadline := time.Now().Add(5 * time.Second)
	for {
		sb, err := h.d.c.GetSandbox(ctx, name)
		if err != nil {
			return 0, "", err
		}
		if sb.Usage != nil && ready(sb.Usage) {
			break
		}
		if time.Now().After(deadline) {
			return 0, "", fmt.Errorf("neighbour %s not at work: usage %+v", name, sb.Usage)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(neighbourWarm)
	p50, err := h.execP50(ctx, calm, n)
	return p50, loadavg(3), err
}

// execP50 is the median of n back-to-back execs of /bin/true in sb, in ms.
func (h *harness) execP50(ctx context.Context, sb string, n int) (float64, error) {
	d := make([]time.Duration, 0, n)
	for i := range n {
		t0 := time.Now()
		res, err := h.d.c.Exec(ctx, sb, wire.Exec{Argv: []string{"/bin/true"}})
		if err != nil {
			return 0, fmt.Errorf("exec %d: %w", i, err)
		}
		if res.Exit.Reason != wire.ExitExited || res.Exit.Code != 0 {
			return 0, fmt.Errorf("exec %d: exit %+v", i, res.Exit)
		}
		d = append(d, time.Since(t0))
	}
	return ms(pct(d, 50)), nil
}
