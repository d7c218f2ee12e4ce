package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// scale measures a busy host (issue 13): listing the sessions of one
// sandbox with cfg.ScaleSessions running, against a raw bbolt scan of the
// same records (a copy of runnerd's registry file, read in the same
// round); spawn p50 with those sessions live against an idle daemon;
// destroying that sandbox; and listing cfg.ScaleSandboxes sandboxes paged
// to the end against the same raw scan of the sandbox records.
func (h *harness) scale(ctx context.Context) error {
	c := h.d.c
	n, probes := h.cfg.ScaleSessions, h.cfg.ScaleProbes
	spawnP50 := func(sb string, prefix string) (float64, error) {
		var d []time.Duration
		for i := range probes {
			t0 := time.Now()
			if _, _, err := c.CreateSession(ctx, sb, wire.CreateSession{ID: fmt.Sprintf("%s-%d", prefix, i), Argv: []string{"/bin/true"}}); err != nil {
				return 0, fmt.Errorf("spawn %d: %w", i, err)
			}
			d = append(d, time.Since(t0))
		}
		return ms(pct(d, 50)), nil
	}
	idleSB, err := h.newSandbox(ctx, "spawn-idle")
	if err != nil {
		return err
	}
	defer h.dropSandbox(ctx, idleSB)
	idle, err := spawnP50(idleSB, "idle")
	if err != nil {
		return err
	}

	busy, err := h.newSandbox(ctx, "busy")
	if err != nil {
		return err
	}
	dropped := false
	defer func() {
		if !dropped {
			h.dropSandbox(ctx, busy)
		}
	}()
	t0 := time.Now()
	for i := range n {
		if _, _, err := c.CreateSession(ctx, busy, wire.CreateSession{ID: fmt.Sprintf("live-%05d", i), Argv: []string{"sleep", "infinity"}}); err != nil {
			return fmt.Errorf("spawn live session %d: %w", i, err)
		}
	}
	h.logf("spawned %d live sessions in %s", n, time.Since(t0).Round(time.Millisecond))

	loadSB, err := h.newSandbox(ctx, "spawn-busy")
	if err != nil {
		return err
	}
	defer h.dropSandbox(ctx, loadSB)
	loaded, err := spawnP50(loadSB, "busy")
	if err != nil {
		return err
	}
	h.rep.add(Figure{Name: fmt.Sprintf("spawn ack p50, %d live sessions", n), Unit: "ms",
		Value: []float64{loaded}, Baseline: []float64{idle}, BaseName: "spawn p50, idle daemon", Ratio: []float64{loaded / idle},
		Target: "≤ 2×", Met: met(loaded/idle <= 2)})

	// The records the listing reads, as runnerd last committed them.
	time.Sleep(time.Second) // deferred commits land
	var list, scan []float64
	for range h.cfg.Repeat {
		var ld, sd []time.Duration
		for range probes {
			t0 := time.Now()
			got, err := c.Sessions(ctx, busy)
			d := time.Since(t0)
			if err != nil {
				return fmt.Errorf("list sessions: %w", err)
			}
			if len(got) != n {
				return fmt.Errorf("list sessions: got %d, want %d", len(got), n)
			}
			ld = append(ld, d)
		}
		snap, err := h.snapshotRegistry()
		if err != nil {
			return err
		}
		for range probes {
			d, k, err := rawScan(snap, "sessions", []byte(busy+"\x00"), func(v []byte) error {
				var s registry.Session
				return json.Unmarshal(v, &s)
			})
			if err != nil {
				return err
			}
			if k != n {
				return fmt.Errorf("raw scan: %d sessions, want %d", k, n)
			}
			sd = append(sd, d)
		}
		list, scan = append(list, ms(pct(ld, 50))), append(scan, ms(pct(sd, 50)))
	}
	r := ratios(list, scan)
	h.rep.add(Figure{Name: fmt.Sprintf("list sessions p50, %d running in one sandbox", n), Unit: "ms",
		Value: list, Baseline: scan, BaseName: "raw bbolt scan of the same records", Ratio: r,
		Target: "≤ 50 ms and ≤ 5×", Met: met(Summarize(list).Median <= 50 && Summarize(r).Median <= 5)})

	t0 = time.Now()
	err = c.DeleteSandbox(ctx, busy)
	took := time.Since(t0)
	dropped = true
	if err != nil {
		return fmt.Errorf("destroy a sandbox of %d running sessions: %w", n, err)
	}
	h.rep.add(Figure{Name: fmt.Sprintf("destroy a sandbox with %d running sessions", n), Unit: "s",
		Value: []float64{took.Seconds()}, Target: "report; no uncertain", Met: met(true)})

	return h.scaleSandboxes(ctx)
}

// scaleSandboxes creates cfg.ScaleSandboxes sandboxes, lists them paged to
// the end (pages of wire.MaxListLimit) against a raw scan of the same
// records, and destroys them.
func (h *harness) scaleSandboxes(ctx context.Context) error {
	c := h.d.c
	m := h.cfg.ScaleSandboxes
	names := make([]string, m)
	for i := range names {
		names[i] = fmt.Sprintf("many-%06d", i)
	}
	each := func(fn func(string) error) error {
		var wg sync.WaitGroup
		var next atomic.Int64
		errs := make([]error, 8)
		for w := range errs {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(m); i = next.Add(1) - 1 {
					if err := fn(names[i]); err != nil {
						errs[w] = err
						return
					}
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
	defer each(func(name string) error { h.dropSandbox(ctx, name); return nil })
	t0 := time.Now()
	if err := each(func(name string) error {
		_, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: name})
		return err
	}); err != nil {
		return fmt.Errorf("create sandboxes: %w", err)
	}
	h.logf("created %d sandboxes in %s", m, time.Since(t0).Round(time.Millisecond))
	time.Sleep(time.Second)
	total, err := c.ListAllSandboxes(ctx)
	if err != nil {
		return err
	}
	var list, scan []float64
	for range h.cfg.Repeat {
		var ld, sd []time.Duration
		for range h.cfg.ScaleProbes {
			t0 := time.Now()
			got, err := c.ListAllSandboxes(ctx)
			if err != nil {
				return fmt.Errorf("list sandboxes: %w", err)
			}
			ld = append(ld, time.Since(t0))
			if len(got) != len(total) {
				return fmt.Errorf("list sandboxes: %d, want %d", len(got), len(total))
			}
		}
		snap, err := h.snapshotRegistry()
		if err != nil {
			return err
		}
		for range h.cfg.ScaleProbes {
			d, k, err := rawScan(snap, "sandboxes", nil, func(v []byte) error {
				var sb registry.Sandbox
				return json.Unmarshal(v, &sb)
			})
			if err != nil {
				return err
			}
			if k != len(total) {
				return fmt.Errorf("raw scan: %d sandboxes, want %d", k, len(total))
			}
			sd = append(sd, d)
		}
		list, scan = append(list, ms(pct(ld, 50))), append(scan, ms(pct(sd, 50)))
	}
	r := ratios(list, scan)
	h.rep.add(Figure{Name: fmt.Sprintf("list sandboxes p50, %d paged to the end", m), Unit: "ms",
		Note:  fmt.Sprintf("%d sandboxes in all, pages of %d", len(total), wire.MaxListLimit),
		Value: list, Baseline: scan, BaseName: "raw bbolt scan of the same records", Ratio: r,
		Target: "≤ 5×", Met: met(Summarize(r).Median <= 5)})
	return nil
}

// snapshotRegistry copies runnerd's registry file (runnerd holds its lock,
// so it cannot be opened in place) into the run's directory and returns
// the copy's path. bbolt keeps two meta pages and opens the copy at the
// last committed one.
func (h *harness) snapshotRegistry() (string, error) {
	src, err := os.Open(filepath.Join(h.d.state, "registry.db"))
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst := filepath.Join(h.dir, "registry-copy.db")
	out, err := os.Create(dst)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return "", err
	}
	return dst, out.Close()
}

// rawScan is the baseline of a listing: open the registry copy at path,
// walk bucket from prefix and decode each record with decode, as a
// program with the file to itself would. It returns the time from open to
// the last record decoded and how many records it read.
func rawScan(path, bucket string, prefix []byte, decode func([]byte) error) (time.Duration, int, error) {
	t0 := time.Now()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, 0, fmt.Errorf("open registry copy: %w", err)
	}
	defer db.Close()
	n := 0
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return fmt.Errorf("no bucket %s", bucket)
		}
		cur := b.Cursor()
		for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
			if err := decode(v); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return time.Since(t0), n, err
}
