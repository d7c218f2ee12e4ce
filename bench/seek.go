package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// seek measures time to first byte (attach handshake to the first data
// frame) from the middle of a SeekBigBytes journal against the same from
// SeekSmallCursor in a SeekSmallBytes journal, probes interleaved.
func (h *harness) seek(ctx context.Context) error {
	sb, err := h.newSandbox(ctx, "seek")
	if err != nil {
		return err
	}
	defer h.dropSandbox(ctx, sb)
	big, small := "big", "small"
	for id, n := range map[string]int64{big: h.cfg.SeekBigBytes, small: h.cfg.SeekSmallBytes} {
		argv := []string{"head", "-c", fmt.Sprint(n), "/dev/zero"}
		if _, _, err := h.d.c.CreateSession(ctx, sb, wire.CreateSession{ID: id, Argv: argv}); err != nil {
			return err
		}
	}
	t0 := time.Now()
	for _, id := range []string{big, small} {
		if err := h.waitExit(ctx, sb, id); err != nil {
			return err
		}
	}
	h.logf("wrote %s and %s journals in %s", sizeName(h.cfg.SeekBigBytes), sizeName(h.cfg.SeekSmallBytes), time.Since(t0).Round(time.Millisecond))
	bigAt, smallAt := h.cfg.SeekBigBytes/2, h.cfg.SeekSmallCursor
	var vb, vs []float64
	for round := range h.cfg.Repeat {
		var db, ds []time.Duration
		for range h.cfg.SeekProbes {
			d, err := h.firstByte(ctx, sb, big, bigAt)
			if err != nil {
				return err
			}
			db = append(db, d)
			d, err = h.firstByte(ctx, sb, small, smallAt)
			if err != nil {
				return err
			}
			ds = append(ds, d)
		}
		vb, vs = append(vb, ms(pct(db, 50))), append(vs, ms(pct(ds, 50)))
		h.logf("round %d: first byte p50 %.3f ms at %s vs %.3f ms at %s", round+1, vb[round], sizeName(bigAt), vs[round], sizeName(smallAt))
	}
	r := ratios(vb, vs)
	h.rep.add(Figure{Name: "seek: time to first byte p50",
		Note: fmt.Sprintf("attach at %s in %s, %d probes", sizeName(bigAt), sizeName(h.cfg.SeekBigBytes), h.cfg.SeekProbes),
		Unit: "ms", Value: vb, Baseline: vs, BaseName: fmt.Sprintf("at %s in %s", sizeName(smallAt), sizeName(h.cfg.SeekSmallBytes)),
		Ratio: r, Target: "≤ 2×", Met: met(Summarize(r).Median <= 2)})
	return nil
}

// firstByte times an attach at cursor to its first data frame.
func (h *harness) firstByte(ctx context.Context, sb, id string, cursor int64) (time.Duration, error) {
	t0 := time.Now()
	fr, err := h.d.c.Attach(ctx, sb, id, client.Cursors{Stdout: cursor})
	if err != nil {
		return 0, err
	}
	defer fr.Close()
	f, err := fr.Next()
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if f.Kind != wire.FrameData || f.Offset != cursor {
		return 0, fmt.Errorf("first frame %v at %d, want data at %d", f.Kind, f.Offset, cursor)
	}
	return d, nil
}

// waitExit polls a session until it is no longer running.
func (h *harness) waitExit(ctx context.Context, sb, id string) error {
	for {
		s, err := h.d.c.Session(ctx, sb, id)
		if err != nil {
			return err
		}
		if s.State != wire.SessionRunning {
			if s.Exit == nil || s.Exit.Reason != wire.ExitExited || s.Exit.Code != 0 {
				return fmt.Errorf("session %s ended %+v, want exit 0", id, s.Exit)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
