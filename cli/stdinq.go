package cli

// The stdin forwarder of attach, exec -i and run: runner's stdin goes
// to the session in order, and what is typed while runnerd restarts is
// kept (bounded) and delivered once it serves again, exactly once.
//
// Exactly once holds because every write carries its offset (the count
// of the session's stdin bytes before it, Runner-Stdin-Offset): the
// session's shim, which outlives runnerd, skips what the command already
// got. So a write whose fate is unknown (runnerd killed mid-request, a
// cut connection, 503 uncertain) is sent again, the same bytes at the
// same offset, until an answer says it was delivered. The first offset
// comes from an empty write at 0, which answers the count. Against a
// runnerd that predates offsets, a write is sent again only after a
// failure that proves nothing was delivered (a refused connection, 503
// without uncertain); one cut in flight is not resent, and runner says
// the input may not have reached the session.

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
)

// maxPendingStdin bounds what runner holds of its stdin not yet
// delivered: past it runner stops reading (a pipe waits; the kernel's
// terminal queue holds what is typed) until the session takes more.
const maxPendingStdin = 1 << 20

// stdinQueue is input read but not yet delivered, in order. Safe for
// the reader and the writer goroutines.
type stdinQueue struct {
	mu      sync.Mutex // guards chunks, size, eof, stopped
	chunks  [][]byte
	size    int
	eof     bool          // the reader saw EOF: close the session's stdin once drained
	stopped bool          // the writer is done (the command exited): input is discarded
	ready   chan struct{} // a chunk or EOF was queued (for the writer)
	space   chan struct{} // a chunk left the queue (for the reader)
}

func newStdinQueue() *stdinQueue {
	return &stdinQueue{ready: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

func signal1(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (q *stdinQueue) wake() { signal1(q.ready) }

// push queues p, waiting while the queue holds maxPendingStdin (one
// chunk always fits an empty queue). After stop, p is discarded:
// nothing will deliver it.
func (q *stdinQueue) push(ctx context.Context, p []byte) {
	for {
		q.mu.Lock()
		if q.stopped {
			q.mu.Unlock()
			return
		}
		if q.size == 0 || q.size+len(p) <= maxPendingStdin {
			q.chunks = append(q.chunks, p)
			q.size += len(p)
			q.mu.Unlock()
			q.wake()
			return
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-q.space:
		}
	}
}

func (q *stdinQueue) closeInput() {
	q.mu.Lock()
	q.eof = true
	q.mu.Unlock()
	q.wake()
}

// next is the oldest chunk, or nil; eof reports that no more will come.
func (q *stdinQueue) next() (p []byte, eof bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.chunks) > 0 {
		return q.chunks[0], false
	}
	return nil, q.eof
}

func (q *stdinQueue) pop() {
	q.mu.Lock()
	q.size -= len(q.chunks[0])
	q.chunks = q.chunks[1:]
	q.mu.Unlock()
	signal1(q.space)
}

// waitEmpty waits until every queued chunk was delivered (or dropped),
// at most d.
func (q *stdinQueue) waitEmpty(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		q.mu.Lock()
		empty := q.size == 0
		q.mu.Unlock()
		if empty || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-q.space:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (q *stdinQueue) stop() {
	q.mu.Lock()
	q.stopped = true
	q.chunks, q.size = nil, 0
	q.mu.Unlock()
	signal1(q.space)
}

func (q *stdinQueue) clear() {
	q.mu.Lock()
	q.chunks, q.size = nil, 0
	q.mu.Unlock()
	signal1(q.space)
}

// notDelivered reports whether a failed stdin write provably did not
// reach the command, so sending it again cannot deliver it twice.
func notDelivered(err error) bool {
	if client.Refused(err) {
		return true
	}
	var api *client.APIError
	return errors.As(err, &api) && errors.Is(err, adapter.ErrUnavailable) && !api.Uncertain && !api.Exhausted
}

// stdinForwarder reads in and delivers it to session id: read, which
// owns the read side, and write, which owns delivery. detach is signalled
// when the detach key is read.
type stdinForwarder struct {
	e        *env
	c        *client.Client
	name, id string
	in       *os.File
	tty      bool // a TTY session: EOF is not sent as close-stdin
	key      byte
	useKey   bool // interactive and a detach key is set
	notice   func(string)
	q        *stdinQueue
	// off is the session's stdin count where the next write goes
	// (owned by write), offsetUnknown or offsetNone.
	off int64
}

// read copies runner's stdin into the queue until EOF, a read error or
// the detach key. It may stay blocked in a read when runner finishes;
// runner exits right after, so it is not waited for.
func (f *stdinForwarder) read(ctx context.Context, detached chan<- struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, rerr := f.in.Read(buf)
		p := buf[:n]
		hit := false
		if f.useKey {
			for i, b := range p {
				if b == f.key {
					p, hit = p[:i], true
					break
				}
			}
		}
		if len(p) > 0 {
			f.q.push(ctx, append([]byte(nil), p...))
		}
		if hit {
			// What was typed before the key goes first, as it did
			// before the detach.
			f.q.waitEmpty(ctx, 2*time.Second)
			detached <- struct{}{}
			return
		}
		if rerr != nil {
			if rerr == io.EOF {
				f.q.closeInput()
			}
			return
		}
	}
}

// offsetUnknown and offsetNone are the states of stdinForwarder.off
// besides a count: not learnt yet, and runnerd predates offsets.
const (
	offsetUnknown = -1
	offsetNone    = -2
)

// resendable reports whether a failed write with an offset may be sent
// again as is: runnerd did not answer (down, restarting, cut), or
// answered that it could not act now. The offset makes a resend
// harmless whatever reached the command.
func resendable(err error) bool {
	return client.Refused(err) || errors.Is(err, adapter.ErrUnavailable) || errors.Is(err, adapter.ErrRateLimited)
}

// send delivers p (or, for nil, EOF): with an offset once f.off is
// known, learning it first (an empty write at 0 answers the count), and
// holds the count the answer gives.
func (f *stdinForwarder) send(ctx context.Context, p []byte) error {
	wctx, cancel := f.e.callCtx(ctx)
	defer cancel()
	if p == nil {
		if f.tty {
			return nil
		}
		return f.c.CloseStdin(wctx, f.name, f.id)
	}
	if f.off == offsetUnknown {
		n, err := f.c.WriteStdinAt(wctx, f.name, f.id, 0, nil)
		switch {
		case errors.Is(err, adapter.ErrNotSupported):
			n = -1 // a session supervisor older than offsets
		case err != nil:
			return err
		}
		f.off = n
		if n < 0 {
			f.off = offsetNone
		}
	}
	if f.off == offsetNone {
		return f.c.WriteStdin(wctx, f.name, f.id, p)
	}
	n, err := f.c.WriteStdinAt(wctx, f.name, f.id, f.off, p)
	if errors.Is(err, adapter.ErrNotSupported) {
		// Nothing was written (501); the session cannot take offsets.
		f.off = offsetNone
		return f.c.WriteStdin(wctx, f.name, f.id, p)
	}
	if err != nil {
		return err
	}
	f.off = n
	if n < 0 { // runnerd was replaced by one that predates offsets
		f.off = offsetNone
	}
	return nil
}

// write delivers the queue in order until ctx ends, the command exits,
// or EOF was delivered (close-stdin for a pipes session).
func (f *stdinForwarder) write(ctx context.Context) {
	defer f.q.stop()
	f.off = offsetUnknown
	waiting := false // a "kept until runnerd is back" notice was given
	var lostAt time.Time
	backoff := 100 * time.Millisecond
	for {
		p, eof := f.q.next()
		if p == nil && !eof {
			select {
			case <-ctx.Done():
				return
			case <-f.q.ready:
				continue
			}
		}
		err := f.send(ctx, p)
		// With an offset (or none needed: learning it, closing stdin,
		// which is idempotent) any failure that is runnerd's absence is
		// sent again; without one only a provable non-delivery is.
		again := notDelivered(err) || (resendable(err) && (f.off != offsetNone || p == nil))
		switch {
		case ctx.Err() != nil, errors.Is(err, adapter.ErrCommandExited):
			return // the exit frame follows
		case err == nil:
			if waiting {
				f.notice("input delivered")
				waiting = false
			}
			lostAt, backoff = time.Time{}, 100*time.Millisecond
			if p == nil {
				return // EOF delivered
			}
			f.q.pop()
			continue
		case again:
			if lostAt.IsZero() {
				lostAt = time.Now()
			}
			if reconnectGiveUp(lostAt) {
				if notDelivered(err) {
					f.notice("input did not reach the session: " + oneLine(detailOf(err)))
				} else {
					f.notice("input may not have reached the session: " + oneLine(detailOf(err)))
				}
				f.q.clear()
				if f.off >= 0 {
					f.off = offsetUnknown // learnt again before the next write
				}
				lostAt, waiting = time.Time{}, false
				continue
			}
			if !waiting {
				waiting = true
				f.notice("runnerd is away: input is kept and sent once it is back")
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		// It may have reached the command, in part: never sent twice.
		f.notice("input may not have reached the session: " + oneLine(detailOf(err)))
		if p == nil {
			return
		}
		if f.off >= 0 {
			f.off = offsetUnknown
		}
		f.q.pop()
	}
}
