package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// lineLen is the length of one writer line: 23 digits and a newline.
const lineLen = 24

func monotonic() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// latencies parses complete writer lines at the front of buf, appending
// now minus each line's timestamp to out; it returns the unparsed rest.
func latencies(buf []byte, now time.Duration, out []time.Duration) ([]byte, []time.Duration, error) {
	for len(buf) >= lineLen {
		ns, err := strconv.ParseInt(string(buf[:lineLen-1]), 10, 64)
		if err != nil || buf[lineLen-1] != '\n' {
			return buf, out, fmt.Errorf("bad writer line %q", buf[:lineLen])
		}
		out = append(out, now-time.Duration(ns))
		buf = buf[lineLen:]
	}
	return buf, out, nil
}

// follow measures write-in-the-command to arrival-at-the-attached-client
// latency, against the same writer's lines read from a pipe by this
// process.
func (h *harness) follow(ctx context.Context) error {
	sb, err := h.newSandbox(ctx, "follow")
	if err != nil {
		return err
	}
	defer h.dropSandbox(ctx, sb)
	var f50, f99, p50, p99 []float64
	for round := range h.cfg.Repeat {
		pipe, err := h.followPipe(ctx)
		if err != nil {
			return fmt.Errorf("pipe: %w", err)
		}
		att, err := h.followAttach(ctx, sb)
		if err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		f50, f99 = append(f50, us(pct(att, 50))), append(f99, us(pct(att, 99)))
		p50, p99 = append(p50, us(pct(pipe, 50))), append(p99, us(pct(pipe, 99)))
		h.logf("round %d: follow p50 %.0f p99 %.0f µs; pipe p50 %.0f p99 %.0f µs", round+1, f50[round], f99[round], p50[round], p99[round])
	}
	note := fmt.Sprintf("%d writes of 24 B, %s apart", h.cfg.FollowWrites, h.cfg.FollowInterval)
	h.rep.add(Figure{Name: "follow latency p50", Note: note, Unit: "µs", Value: f50, Baseline: p50,
		BaseName: "pipe between two processes", Ratio: ratios(f50, p50), Target: "report"})
	h.rep.add(Figure{Name: "follow latency p99", Note: note, Unit: "µs", Value: f99, Baseline: p99,
		BaseName: "pipe between two processes", Ratio: ratios(f99, p99), Target: "report"})
	return nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func (h *harness) writerArgv() []string {
	return []string{h.bins.writer, strconv.Itoa(h.cfg.FollowWrites), h.cfg.FollowInterval.String()}
}

func (h *harness) followPipe(ctx context.Context) ([]time.Duration, error) {
	argv := h.writerArgv()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader("go\n")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer cmd.Wait()
	var lat []time.Duration
	var pending []byte
	buf := make([]byte, 4096)
	for {
		n, err := out.Read(buf)
		if n > 0 {
			now := monotonic()
			pending = append(pending, buf[:n]...)
			var perr error
			if pending, lat, perr = latencies(pending, now, lat); perr != nil {
				return nil, perr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(lat) != h.cfg.FollowWrites {
		return nil, fmt.Errorf("got %d lines, want %d", len(lat), h.cfg.FollowWrites)
	}
	return lat, nil
}

func (h *harness) followAttach(ctx context.Context, sb string) ([]time.Duration, error) {
	c := h.d.c
	id := h.name("follow")
	if _, _, err := c.CreateSession(ctx, sb, wire.CreateSession{ID: id, Argv: h.writerArgv()}); err != nil {
		return nil, err
	}
	fr, err := c.Attach(ctx, sb, id, client.Cursors{})
	if err != nil {
		return nil, err
	}
	defer fr.Close()
	if err := c.WriteStdin(ctx, sb, id, []byte("go\n")); err != nil {
		return nil, err
	}
	var lat []time.Duration
	var pending []byte
	for {
		f, err := fr.Next()
		if err != nil {
			return nil, err
		}
		now := monotonic()
		if f.Kind != wire.FrameData {
			if f.Kind != wire.FrameExit {
				return nil, fmt.Errorf("terminal frame %v, want exit", f.Kind)
			}
			break
		}
		if f.Stream != 1 {
			return nil, fmt.Errorf("writer wrote on stream %d: %q", f.Stream, bytes.TrimSpace(f.Payload))
		}
		pending = append(pending, f.Payload...)
		if pending, lat, err = latencies(pending, now, lat); err != nil {
			return nil, err
		}
	}
	if len(lat) != h.cfg.FollowWrites {
		return nil, fmt.Errorf("got %d lines, want %d", len(lat), h.cfg.FollowWrites)
	}
	return lat, nil
}
