package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/wire"
)

// idleWorkers spawn idle sessions in parallel, each into its own sandbox
// (runnerd serializes spawns within one sandbox).
const idleWorkers = 4

// idle measures the private memory of idle sessions (sleep infinity):
// the daemon's growth plus every shim's own, per session, at each count
// of cfg.Idle. It ends every session it started by terminate, then
// destroys the sandboxes.
func (h *harness) idle(ctx context.Context) error {
	c := h.d.c
	sbs := make([]string, idleWorkers)
	for i := range sbs {
		sb, err := h.newSandbox(ctx, "idle")
		if err != nil {
			return err
		}
		sbs[i] = sb
	}
	type sess struct{ sb, id string }
	var mu sync.Mutex
	var started []sess
	defer func() {
		t0 := time.Now()
		var wg sync.WaitGroup
		work := make(chan sess)
		for range 8 {
			wg.Go(func() {
				for s := range work {
					if _, err := c.Terminate(ctx, s.sb, s.id, 2*time.Second); err != nil {
						h.logf("terminate %s/%s: %v", s.sb, s.id, err)
					}
				}
			})
		}
		for _, s := range started {
			work <- s
		}
		close(work)
		wg.Wait()
		for _, sb := range sbs {
			h.dropSandbox(ctx, sb)
		}
		h.logf("ended %d idle sessions in %s", len(started), time.Since(t0).Round(time.Millisecond))
	}()

	time.Sleep(time.Second)
	base, err := readMemory(h.d.pid)
	if err != nil {
		return err
	}
	for _, n := range h.cfg.Idle {
		loadBefore := loadavg(1)
		t0 := time.Now()
		todo := n - len(started)
		var wg sync.WaitGroup
		errs := make(chan error, idleWorkers)
		for w := range idleWorkers {
			wg.Go(func() {
				for i := w; i < todo; i += idleWorkers {
					if i >= idleWorkers && h.cfg.IdlePace > 0 {
						time.Sleep(idleWorkers * h.cfg.IdlePace)
					}
					id := fmt.Sprintf("idle-%d-%d", n, i)
					_, _, err := c.CreateSession(ctx, sbs[w], wire.CreateSession{ID: id, Argv: []string{"sleep", "infinity"}})
					if err != nil {
						errs <- fmt.Errorf("spawn %s: %w", id, err)
						return
					}
					mu.Lock()
					started = append(started, sess{sbs[w], id})
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		spawned := time.Since(t0)
		time.Sleep(2 * time.Second) // let the shims' and the daemon's collectors settle
		d, err := readMemory(h.d.pid)
		if err != nil {
			return err
		}
		pids, err := shimPIDs(h.d.state)
		if err != nil {
			return err
		}
		var shims, cmds memory
		count := 0
		for _, pid := range pids {
			m, err := readMemory(pid)
			if err != nil {
				continue
			}
			shims = shims.add(m)
			count++
			for _, ch := range children(pid) {
				if m, err := readMemory(ch); err == nil {
					cmds = cmds.add(m)
				}
			}
		}
		if count != n {
			return fmt.Errorf("found %d live shims, want %d", count, n)
		}
		grow := d.sub(base)
		per := func(sel func(memory) int64) (float64, string) {
			dm, sm := float64(sel(grow))/float64(n)/(1<<20), float64(sel(shims))/float64(n)/(1<<20)
			return dm + sm, fmt.Sprintf("daemon %+.3f + shim %.3f MiB/session", dm, sm)
		}
		pss, pssBreak := per(func(m memory) int64 { return m.Pss })
		pd, pdBreak := per(func(m memory) int64 { return m.PrivateDirty })
		h.logf("%d idle sessions (spawned in %s, 1-min load %s → %s): Pss %.3f MiB/session (%s); Private_Dirty %.3f (%s); daemon Rss %.1f MiB; sleep Pss %.3f MiB each",
			n, spawned.Round(time.Millisecond), loadBefore, loadavg(1), pss, pssBreak, pd, pdBreak, float64(d.Rss)/(1<<20), float64(cmds.Pss)/float64(n)/(1<<20))
		h.rep.add(Figure{Name: fmt.Sprintf("idle cost per session, Pss, %d sessions", n), Unit: "MiB",
			Value: []float64{pss}, BaseName: pssBreak, Target: "≤ 1.5 MiB", Met: met(pss <= 1.5)})
		h.rep.add(Figure{Name: fmt.Sprintf("idle cost per session, Private_Dirty, %d sessions", n), Unit: "MiB",
			Value: []float64{pd}, BaseName: pdBreak, Target: "≤ 1.5 MiB", Met: met(pd <= 1.5)})
	}
	return nil
}

// loadavg is the first n figures of /proc/loadavg (1, 5 and 15 minutes),
// space-separated, or "?".
func loadavg(n int) string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) >= n {
		return strings.Join(f[:n], " ")
	}
	return "?"
}
