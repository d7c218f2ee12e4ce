package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// Conn is one connection's frame sequence, as a provider's transport
// delivers it: runnerd's attach WebSocket, or runner-shim attach's output
// read through a hosted provider's exec API.
type Conn interface {
	// Next returns the next frame. A transport failure (a cut, a
	// heartbeat timeout, a gap in the data) is an error of the adapter
	// taxonomy; an *adapter.UnavailableError is worth reattaching from.
	// After Close it returns an error. The frame's payload belongs to
	// the caller.
	Next() (wire.Frame, error)
	// Close ends the connection and unblocks Next. It must not block, may
	// be called from any goroutine, and is idempotent.
	Close() error
}

// Dialer opens a new connection to the same session from a cursor: every
// byte before it the consumer already has. ctx ends when the consumer
// closes the stream; a Dialer bounds each attempt itself.
type Dialer func(ctx context.Context, from adapter.Cursor) (Conn, error)

// Options tune a stream made by New.
type Options struct {
	// Provider names the adapter in the *adapter.ProviderError frames it
	// may produce.
	Provider string
	// Buffer is the number of frames the channel holds (minimum 1).
	Buffer int
	// ReattachWindow is how long the stream keeps dialing again (with
	// backoff from 100ms to 2s) after a transient transport failure,
	// from the cursor the consumer has. Zero disables reattaching: the
	// failure is the terminal frame.
	ReattachWindow time.Duration
}

// errClosed ends the producer once the consumer closed the stream; it
// never reaches the consumer.
var errClosed = errors.New("stream closed by its consumer")

// New returns the stream of session id read from first, which was opened
// at from. Its producer goroutine forwards every frame as the contract's
// frame (see Frame) until the terminal one; after a transient failure of
// the connection it dials again with dial (nil: never) from the cursor of
// the frames it forwarded, so the consumer sees each byte exactly once,
// and ends with an *adapter.UnavailableError when that fails. A truncated
// answer to the redial is the terminal frame as is (bytes were lost).
//
// The stream owns first and every later connection and its goroutine:
// Close closes the current connection, cancels a dial, and waits for the
// goroutine. The session keeps running.
func New(id string, first Conn, from adapter.Cursor, dial Dialer, opts Options) adapter.Stream {
	ctx, cancel := context.WithCancel(context.Background())
	s := &feedStream{id: id, conn: first, cur: from, dial: dial, opts: opts, done: make(chan struct{}), cancel: cancel}
	s.Feed = adapter.NewFeed(id, opts.Buffer, s.detach)
	go s.produce(ctx)
	return s
}

// feedStream is the Stream New returns.
type feedStream struct {
	*adapter.Feed
	id     string
	dial   Dialer
	opts   Options
	cancel context.CancelFunc // ends the producer's context (a dial in flight)
	done   chan struct{}      // closed when produce returns

	mu   sync.Mutex // guards conn
	conn Conn       // the current connection; replaced on a reattach

	cur adapter.Cursor // what the consumer has; the producer's alone
}

// detach is the Feed's onClose: it unblocks the producer's Next or dial.
func (s *feedStream) detach() {
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn.Close()
}

// Close detaches the transport and waits for the producer. It is
// idempotent.
func (s *feedStream) Close() error {
	_ = s.Feed.Close()
	<-s.done
	return nil
}

func (s *feedStream) closed() bool {
	select {
	case <-s.Feed.Done():
		return true
	default:
		return false
	}
}

func (s *feedStream) produce(ctx context.Context) {
	defer close(s.done)
	defer s.cancel()
	defer func() {
		s.mu.Lock()
		s.conn.Close()
		s.mu.Unlock()
	}()
	// The producer is the only writer of s.conn (reattach, under mu), so
	// it reads it without the lock.
	conn := s.conn
	for {
		f, err := conn.Next()
		if err != nil {
			conn.Close()
			if s.closed() {
				s.Feed.Stop()
				return
			}
			if err = s.reattach(ctx, err); err == nil {
				conn = s.conn
				continue
			}
			if errors.Is(err, errClosed) {
				s.Feed.Stop()
				return
			}
			_ = s.Feed.Send(ctx, adapter.Frame{Err: err})
			return
		}
		out, ok := Frame(s.opts.Provider, s.id, f)
		if !ok {
			continue
		}
		if err := s.Feed.Send(ctx, out); err != nil || out.Terminal() {
			return
		}
		s.cur.Advance(out)
	}
}

// reattach dials the session again from the cursor until it works, the
// window passes, or the consumer closes. It returns the error to end the
// stream with, or nil with a new connection in place.
func (s *feedStream) reattach(ctx context.Context, cause error) error {
	if s.dial == nil || s.opts.ReattachWindow <= 0 || !errors.Is(cause, adapter.ErrUnavailable) {
		return cause
	}
	deadline := time.Now().Add(s.opts.ReattachWindow)
	wait := 100 * time.Millisecond
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return errClosed
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
		conn, err := s.dial(ctx, s.cur)
		switch {
		case err == nil:
			s.mu.Lock()
			s.conn = conn
			s.mu.Unlock()
			if s.closed() { // closed while we dialed: detach saw the old one
				conn.Close()
				return errClosed
			}
			return nil
		case ctx.Err() != nil:
			return errClosed
		case errors.Is(err, adapter.ErrTruncated):
			return err
		case !adapter.Transient(err), time.Now().After(deadline):
			// Gone (not_found: the sandbox was destroyed under the
			// stream), refused or out of time: a transport failure for
			// this stream, never an exit.
			return &adapter.UnavailableError{Detail: fmt.Sprintf("session %s: connection broke (%v) and attaching again failed: %v", s.id, cause, err)}
		}
	}
}
