package sessiondir

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
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
	// Lease, when positive, bounds the attach in time, and MaxBytes, when
	// positive, in data bytes (the frame that reaches it is sent whole):
	// a bounded attach that reaches either before the session's end emits
	// the lease-end error frame (LeaseEnd) with the cursors to attach
	// again from, instead of following on. A transport that cannot cancel
	// a process it started (E2B's envd keeps it running, and drops its
	// output) relies on this to never leave a follower behind.
	Lease    time.Duration
	MaxBytes int64
	// Ack emits a heartbeat frame as soon as the session's streams are
	// open at the cursors, before any data: a driver that reads the first
	// frame then knows at once whether the attach is good (a heartbeat) or
	// refused (the one error frame: not_found, truncated, invalid), even
	// for a silent session.
	Ack bool
}

// LeaseEnd is the wire error a bounded attach ends with: unavailable (an
// honest transient end for any consumer), its detail
// wire.ShimDetailLeaseEnded and the cursors, "lease ended: stdout=N
// stderr=M".
func LeaseEnd(stdout, stderr int64) wire.Error {
	return wire.Error{Code: wire.CodeUnavailable, Detail: fmt.Sprintf("%s: stdout=%d stderr=%d", wire.ShimDetailLeaseEnded, stdout, stderr)}
}

// errLeaseEnd stops EmitFrames when a bounded attach reached its bound.
var errLeaseEnd = errors.New("lease ended")

// Attach emits the session's frame stream (docs/frames.md) from the
// cursors, following live output, one encoded frame per emit call: data
// frames contiguous per stream from its cursor, heartbeats on silence, and
// exactly one terminal frame last (exit with the record once every byte up
// to the final lengths is emitted; lost when the shim died without a
// record, which Attach then writes into the journal as runnerd does; error
// for a cursor behind the retained data (truncated) or beyond the end
// (invalid), or an unreadable journal (unavailable)).
//
// Attach reads the journal's files, never the shim, so it cannot slow the
// command. It returns nil after the terminal frame, or the error of emit
// or ctx without a terminal frame: the caller then has a transport
// failure, never an exit. The frame slice is reused after emit returns.
func Attach(ctx context.Context, dir string, opts AttachOptions, emit func(frame []byte) error) error {
	fail := func(code wire.Code, detail string) error {
		b, err := wire.AppendError(nil, wire.Error{Code: code, Detail: detail})
		if err != nil {
			return err
		}
		return emit(b)
	}
	if !sessionExists(dir) {
		// The root is the registry of its sessions: no spec, no session.
		// A retrying driver must not loop on it as on an unreadable one.
		return fail(wire.CodeNotFound, fmt.Sprintf("session %s: %v", filepath.Base(dir), ErrNoSession))
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
	readers := map[string]*journal.Reader{}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	for _, name := range streams {
		r, err := j.NewReader(name, cursors[name], true)
		if err != nil {
			return fail(JournalCode(err), err.Error())
		}
		readers[name] = r
	}
	if opts.Ack {
		if err := emit(wire.AppendHeartbeat(nil)); err != nil {
			return err
		}
	}
	src := FrameSource{Dir: dir, Journal: j, Readers: readers, Heartbeat: opts.Heartbeat}
	if opts.Lease <= 0 && opts.MaxBytes <= 0 {
		return EmitFrames(ctx, src, emit)
	}
	return emitBounded(ctx, src, opts, cursors, emit)
}

// emitBounded is EmitFrames under a lease: it counts the data it emits
// and, once the lease's time or bytes are used up, stops before the next
// data frame and ends with the lease-end frame. A terminal frame that is
// ready still goes out (the session ended; nothing to resume).
func emitBounded(ctx context.Context, src FrameSource, opts AttachOptions, cursors map[string]int64, emit func([]byte) error) error {
	lctx := ctx
	if opts.Lease > 0 {
		var cancel context.CancelFunc
		lctx, cancel = context.WithTimeoutCause(ctx, opts.Lease, errLeaseEnd)
		defer cancel()
	}
	next := map[wire.StreamID]int64{wire.StreamStdout: cursors["stdout"], wire.StreamStderr: cursors["stderr"]}
	var sent int64
	err := EmitFrames(lctx, src, func(b []byte) error {
		if len(b) >= wire.FrameHeaderLen && wire.FrameKind(b[2]) == wire.FrameData {
			if opts.MaxBytes > 0 && sent >= opts.MaxBytes {
				return errLeaseEnd
			}
			f, err := wire.ParseFrame(b)
			if err != nil {
				return err
			}
			if err := emit(b); err != nil {
				return err
			}
			sent += int64(len(f.Payload))
			next[f.Stream] = f.End()
			return nil
		}
		return emit(b)
	})
	switch {
	case err == nil: // the terminal frame went out
		return nil
	case errors.Is(err, errLeaseEnd):
	case ctx.Err() == nil && errors.Is(context.Cause(lctx), errLeaseEnd):
	default:
		return err
	}
	b, err := wire.AppendError(nil, LeaseEnd(next[wire.StreamStdout], next[wire.StreamStderr]))
	if err != nil {
		return err
	}
	return emit(b)
}

// FrameSource is what EmitFrames reads: a session's journal and its
// streams, opened by the caller at the cursors it was asked for.
type FrameSource struct {
	// Dir is the session directory. A lost session's exit record is
	// written into its journal (FinishLost), so every reader, runnerd's
	// registry and runner-shim agree on how it ended.
	Dir     string
	Journal *journal.Journal
	// Readers are the session's streams by name ("stdout", "stderr"),
	// opened in follow mode. EmitFrames reads them and has stopped doing
	// so when it returns; the caller closes them.
	Readers map[string]*journal.Reader
	// Heartbeat is the silence after which a heartbeat frame is emitted;
	// 0 means DefaultHeartbeat, a negative value disables heartbeats.
	Heartbeat time.Duration
	// OnExit, if not nil, is called with the session's exit (lost
	// included) just before its terminal frame is emitted.
	OnExit func(wire.Exit)
	// Log, if not nil, receives a stream that failed mid-way.
	Log *slog.Logger
}

// EmitFrames is the one journal-to-frame producer: runner-shim's attach
// (Attach) and runnerd's WebSocket attach both call it, so a session ends
// with the same terminal frame whichever path reads it. It emits data
// frames contiguous per stream from each reader's offset, heartbeats on
// silence, and exactly one terminal frame: the exit record once every
// stream reached its final length; lost (after FinishLost wrote the
// record) when the writer died without one; an error frame (JournalCode)
// when a stream failed. It returns nil after the terminal frame, or the
// error of emit or ctx without one. The frame slice is reused after emit
// returns.
func EmitFrames(ctx context.Context, src FrameSource, emit func(frame []byte) error) error {
	hb := src.Heartbeat
	if hb == 0 {
		hb = DefaultHeartbeat
	}
	frame := make([]byte, 0, wire.FrameHeaderLen+attachBuf)
	terminal := func(b []byte, err error) error {
		if err != nil {
			return err
		}
		return emit(b)
	}
	fail := func(code wire.Code, detail string) error {
		return terminal(wire.AppendError(frame[:0], wire.Error{Code: code, Detail: detail}))
	}

	ctx, cancel := context.WithCancel(ctx)
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
	for name, r := range src.Readers {
		id, _ := wire.StreamByName(name)
		ack := make(chan struct{})
		acks[id] = ack
		wg.Add(1)
		// One reader per stream, owned by EmitFrames: it ends on its
		// stream's end or on cancel, and EmitFrames waits for it. Its
		// buffer is handed over and acknowledged, never copied.
		go func() {
			defer wg.Done()
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
	live := len(src.Readers)
	lost := false
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
				var err error
				if frame, err = wire.AppendData(frame[:0], c.stream, c.off, c.data); err != nil {
					return err
				}
				if err := emit(frame); err != nil {
					return err
				}
				// The reader may have gone on ctx's end while emit ran.
				select {
				case acks[c.stream] <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
				if timer != nil {
					timer.Reset(hb)
				}
				continue
			}
			live--
			switch {
			case errors.Is(c.err, io.EOF):
			case errors.Is(c.err, journal.ErrLost):
				lost = true
			case ctx.Err() != nil:
				return ctx.Err()
			default:
				if src.Log != nil {
					src.Log.Warn("attach stream failed", "stream", c.stream.StreamName(), "err", c.err)
				}
				return fail(JournalCode(c.err), c.err.Error())
			}
		}
	}
	e, err := FinalExit(src.Journal, src.Dir, lost)
	if err != nil {
		return fail(wire.CodeUnavailable, err.Error())
	}
	if src.OnExit != nil {
		src.OnExit(e)
	}
	if e.Reason == wire.ExitLost {
		return terminal(wire.AppendLost(frame[:0], e))
	}
	return terminal(wire.AppendExit(frame[:0], e))
}

// LostDetail is the detail of the exit record FinalExit writes for a
// session whose writer died without one.
const LostDetail = "session supervisor died without an exit record"

// FinalExit returns the exit record of a session whose streams have all
// been read to their end. lost says a reader saw the writer gone without
// an exit record; the journal is then finished as lost (FinishLost with
// LostDetail, if nobody did it yet) so every reader agrees. Its errors
// match ErrUnavailable.
func FinalExit(j *journal.Journal, dir string, lost bool) (wire.Exit, error) {
	e, ok, err := j.Exit()
	if err != nil {
		return wire.Exit{}, fmt.Errorf("%w: read exit record: %v", ErrUnavailable, err)
	}
	if !ok {
		if !lost {
			return wire.Exit{}, fmt.Errorf("%w: streams ended without an exit record", ErrUnavailable)
		}
		if e, err = FinishLost(dir, LostDetail); err != nil {
			return wire.Exit{}, err
		}
	}
	return WireExit(e), nil
}

// FinishLost writes the "lost" exit record into the journal of the
// session in dir, whose writer is gone without one, so every later reader
// ends the same way. If another party finished it first, that record is
// returned. A journal that was never created, or whose index a power loss
// tore, is lost without a record to write. Its errors match
// ErrUnavailable.
func FinishLost(dir, detail string) (journal.Exit, error) {
	jdir := filepath.Join(dir, JournalDir)
	w, err := journal.Recover(jdir)
	switch {
	case errors.Is(err, journal.ErrFinished):
	case errors.Is(err, journal.ErrBusy):
		return journal.Exit{}, fmt.Errorf("%w: session journal is busy", ErrUnavailable)
	case err != nil:
		if _, serr := os.Stat(filepath.Join(jdir, "index.db")); errors.Is(serr, os.ErrNotExist) {
			// The shim never created its journal (or a power loss took
			// it before its first sync point): nothing durable ran.
			return journal.Exit{Reason: wire.ExitLost, Detail: "the session never started", Lengths: map[string]int64{}, Time: time.Now().UTC()}, nil
		}
		if errors.Is(err, journal.ErrCorrupt) {
			// A torn index after a power loss: the session is lost, and
			// saying so beats an unavailable answer forever.
			return journal.Exit{Reason: wire.ExitLost, Detail: fmt.Sprintf("%s; journal unreadable: %v", detail, err), Lengths: map[string]int64{}, Time: time.Now().UTC()}, nil
		}
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			// Its record cannot be written now (a full disk): an answer
			// in the taxonomy, retried once there is space.
			return journal.Exit{}, fmt.Errorf("%w: recover journal: %w", ErrWriteFailed, err)
		}
		return journal.Exit{}, fmt.Errorf("%w: recover journal: %v", ErrUnavailable, err)
	default:
		if err := w.Finish(journal.Exit{Reason: wire.ExitLost, Detail: detail}); err != nil && !errors.Is(err, journal.ErrFinished) {
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
				return journal.Exit{}, fmt.Errorf("%w: finish lost journal: %w", ErrWriteFailed, err)
			}
			return journal.Exit{}, fmt.Errorf("%w: finish lost journal: %v", ErrUnavailable, err)
		}
	}
	j, err := journal.Open(jdir)
	if err != nil {
		return journal.Exit{}, fmt.Errorf("%w: open journal: %v", ErrUnavailable, err)
	}
	defer j.Close()
	e, ok, err := j.Exit()
	if err != nil || !ok {
		return journal.Exit{}, fmt.Errorf("%w: read exit record: ok=%v err=%v", ErrUnavailable, ok, err)
	}
	return e, nil
}

// JournalCode is the one mapping of journal errors to wire codes, for an
// attach's error frame and runnerd's error answers: a cursor behind the
// retained data is truncated; a cursor beyond the end or an unknown
// stream is invalid; anything else (an unreadable file) is unavailable.
func JournalCode(err error) wire.Code {
	var ce *journal.CursorError
	switch {
	case errors.Is(err, journal.ErrTruncated):
		return wire.CodeTruncated
	case errors.Is(err, journal.ErrInvalidCursor), errors.As(err, &ce), errors.Is(err, journal.ErrUnknownStream):
		return wire.CodeInvalid
	}
	return wire.CodeUnavailable
}

// WireExit converts a journal exit record to its wire form (the same JSON
// shape).
func WireExit(e journal.Exit) wire.Exit {
	return wire.Exit{Reason: e.Reason, Code: e.Code, Signal: e.Signal, Detail: e.Detail, Lengths: e.Lengths, Time: e.Time, Terminated: e.Terminated, OOMKilled: e.OOMKilled, UnstoredBytes: e.UnstoredBytes, Cause: e.Cause}
}
