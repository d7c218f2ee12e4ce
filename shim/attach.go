package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/wire"
)

// DefaultHeartbeat is the silence after which Attach emits a heartbeat
// frame.
const DefaultHeartbeat = 15 * time.Second

// attachBuf is the largest data frame payload Attach emits.
const attachBuf = 64 << 10

// AttachOptions say where an attach starts and how it keeps alive.
type AttachOptions struct {
	// Stdout and Stderr are the cursors: the number of bytes of each
	// stream the caller already has. A TTY session has no stderr; its
	// cursor must be 0.
	Stdout, Stderr int64
	// Heartbeat is the silence after which a heartbeat frame is emitted;
	// 0 means DefaultHeartbeat, a negative value disables heartbeats.
	Heartbeat time.Duration
}

// Attach emits the session's frame stream (docs/frames.md) from the
// cursors, following live output, one encoded frame per emit call: data
// frames contiguous per stream from its cursor, heartbeats on silence, and
// exactly one terminal frame last (exit with the record once every byte up
// to the final lengths is emitted; lost when the shim died without a
// record; error for a cursor behind the retained data (truncated) or
// beyond the end (invalid), or an unreadable journal (unavailable)).
//
// Attach reads the journal's files, never the shim, so it cannot slow the
// command. It returns nil after the terminal frame, or the error of emit
// or ctx without a terminal frame: the caller then has a transport
// failure, never an exit. The frame slice is reused after emit returns.
func Attach(ctx context.Context, dir string, opts AttachOptions, emit func(frame []byte) error) error {
	hb := opts.Heartbeat
	if hb == 0 {
		hb = DefaultHeartbeat
	}
	var frame []byte
	terminal := func(b []byte, err error) error {
		if err != nil {
			return err
		}
		return emit(b)
	}
	fail := func(code wire.Code, detail string) error {
		return terminal(wire.AppendError(frame[:0], wire.Error{Code: code, Detail: detail}))
	}

	j, err := journal.Open(filepath.Join(dir, JournalDir))
	if err != nil {
		return fail(wire.CodeUnavailable, err.Error())
	}
	defer j.Close()
	cursors := map[string]int64{"stdout": opts.Stdout, "stderr": opts.Stderr}
	var streams []string
	for _, s := range j.Streams() {
		if _, ok := wire.StreamByName(s); ok {
			streams = append(streams, s)
		}
	}
	if len(streams) == 1 && opts.Stderr != 0 {
		return fail(wire.CodeInvalid, "a TTY session has no stderr")
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type chunk struct {
		stream wire.StreamID
		off    int64
		data   []byte
		err    error // final: io.EOF, ErrLost, a cursor error, ctx's
	}
	chunks := make(chan chunk)
	acks := map[wire.StreamID]chan struct{}{}
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel (deferred later, runs first)
	defer cancel()
	for _, name := range streams {
		id, _ := wire.StreamByName(name)
		r, err := j.NewReader(name, cursors[name], true)
		if err != nil {
			code := wire.CodeUnavailable
			switch {
			case errors.Is(err, journal.ErrTruncated):
				code = wire.CodeTruncated
			case errors.Is(err, journal.ErrInvalidCursor):
				code = wire.CodeInvalid
			}
			cancel()
			wg.Wait()
			return fail(code, err.Error())
		}
		ack := make(chan struct{})
		acks[id] = ack
		wg.Add(1)
		// One reader per stream, owned by Attach: it ends on its stream's
		// end or on cancel, and Attach waits for it.
		go func() {
			defer wg.Done()
			defer r.Close()
			buf := make([]byte, attachBuf)
			for {
				off := r.Offset()
				n, err := r.ReadContext(ctx, buf)
				if n > 0 {
					select {
					case chunks <- chunk{stream: id, off: off, data: buf[:n]}:
					case <-ctx.Done():
						return
					}
					select {
					case <-ack:
					case <-ctx.Done():
						return
					}
				}
				if err != nil {
					select {
					case chunks <- chunk{stream: id, off: r.Offset(), err: err}:
					case <-ctx.Done():
					}
					return
				}
			}
		}()
	}

	var timer *time.Timer
	var tick <-chan time.Time
	if hb > 0 {
		timer = time.NewTimer(hb)
		defer timer.Stop()
		tick = timer.C
	}
	live := len(streams)
	lost := false
	lengths := map[string]int64{}
	for live > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			frame = wire.AppendHeartbeat(frame[:0])
			if err := emit(frame); err != nil {
				return err
			}
			timer.Reset(hb)
		case c := <-chunks:
			if c.err == nil {
				if frame, err = wire.AppendData(frame[:0], c.stream, c.off, c.data); err != nil {
					return err
				}
				if err := emit(frame); err != nil {
					return err
				}
				acks[c.stream] <- struct{}{}
				if timer != nil {
					timer.Reset(hb)
				}
				continue
			}
			live--
			lengths[c.stream.StreamName()] = c.off
			switch {
			case errors.Is(c.err, io.EOF):
			case errors.Is(c.err, journal.ErrLost):
				lost = true
			case errors.Is(c.err, journal.ErrTruncated):
				return fail(wire.CodeTruncated, c.err.Error())
			case ctx.Err() != nil:
				return ctx.Err()
			default:
				return fail(wire.CodeUnavailable, c.err.Error())
			}
		}
	}
	if lost {
		return terminal(wire.AppendLost(frame[:0], wire.Exit{Detail: "shim gone without an exit record", Lengths: lengths}))
	}
	e, ok, err := j.Exit()
	if err != nil || !ok {
		return fail(wire.CodeUnavailable, fmt.Sprintf("streams ended without an exit record: %v", err))
	}
	return terminal(wire.AppendExit(frame[:0], WireExit(e)))
}

// WireExit converts a journal exit record to its wire form (the same JSON
// shape).
func WireExit(e journal.Exit) wire.Exit {
	return wire.Exit{Reason: e.Reason, Code: e.Code, Signal: e.Signal, Detail: e.Detail, Lengths: e.Lengths, Time: e.Time, Terminated: e.Terminated, OOMKilled: e.OOMKilled}
}
