package e2b

// A process's event stream from envd (Start and Connect): the Connect
// framing read by Recv, Close, and Drain, which reads it to its end.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// Stream is a server stream of process events. Recv must be called from
// one goroutine at a time; Close may be called from any goroutine, any
// number of times. Closing it never stops the process.
type Stream struct {
	pid    uint32
	ctx    context.Context
	cancel context.CancelFunc
	body   io.ReadCloser
	op     string
	red    httpcall.Redactor

	closeOnce sync.Once
	closed    atomic.Bool
	done      bool // guarded by Recv's single caller
}

// PID is the process's pid, from envd's start event.
func (s *Stream) PID() uint32 { return s.pid }

// Recv returns the next data or end event, skipping keepalives. After the
// stream ended cleanly it returns io.EOF; a stream cut before envd's
// end-stream message is *adapter.UnavailableError; envd's error is mapped
// into the taxonomy (a Lifetime elapsing is deadline_exceeded, unavailable).
func (s *Stream) Recv() (Event, error) {
	for {
		ev, start, err := s.next()
		if err != nil {
			return Event{}, err
		}
		if start != 0 {
			return Event{}, fail(s.op, 0, unavailable("a second start event"))
		}
		if ev != nil {
			return *ev, nil
		}
	}
}

// next reads one message: an event, a start pid, (nil, 0, nil) for a
// keepalive, or an error (io.EOF at a clean end).
func (s *Stream) next() (*Event, uint32, error) {
	if s.done {
		return nil, 0, io.EOF
	}
	flags, msg, err := readEnvelope(s.body)
	if err != nil {
		s.done = true
		if errors.Is(err, errFrame) {
			return nil, 0, fail(s.op, 0, providerErr(err.Error()))
		}
		if s.closed.Load() {
			// The caller's own Close, like cancelling its context.
			return nil, 0, fmt.Errorf("%s: stream closed: %w", s.op, context.Canceled)
		}
		if err == io.EOF {
			err = errors.New("stream ended without an end-stream message")
		}
		return nil, 0, httpcall.TransportError(s.ctx, provider, s.op, err, false, s.red)
	}
	if flags&flagEndStream != 0 {
		s.done = true
		es, err := parseEndStream(msg)
		if err != nil {
			return nil, 0, fail(s.op, 0, providerErr(err.Error()))
		}
		if es.Error != nil {
			if s.ctx.Err() != nil {
				return nil, 0, fmt.Errorf("%s: %w", s.op, s.ctx.Err())
			}
			return nil, 0, connectError(s.op, 0, nil, es.Error.Code, es.Error.Message, true, s.red)
		}
		return nil, 0, io.EOF
	}
	var we wireEvent
	if err := json.Unmarshal(msg, &we); err != nil || we.Event == nil {
		s.done = true
		return nil, 0, fail(s.op, 0, providerErr("undecodable process event"))
	}
	ev := we.Event
	switch {
	case ev.Start != nil:
		return nil, ev.Start.PID, nil
	case ev.Data != nil:
		return &Event{Stdout: ev.Data.Stdout, Stderr: ev.Data.Stderr, PTY: ev.Data.PTY}, 0, nil
	case ev.End != nil:
		end := &EndEvent{Exited: ev.End.Exited, Status: ev.End.Status}
		switch {
		case ev.End.ExitCode != nil:
			end.ExitCode = *ev.End.ExitCode
		case ev.End.ExitCodeProto != nil:
			end.ExitCode = *ev.End.ExitCodeProto
		}
		if ev.End.Error != nil {
			end.Error = *ev.End.Error
		}
		return &Event{End: end}, 0, nil
	}
	// A keepalive, or an event of a newer envd this client does not know:
	// both carry nothing for us.
	return nil, 0, nil
}

// Close ends the stream (not the process). A Recv blocked in another
// goroutine returns an error wrapping context.Canceled.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.cancel()
		s.body.Close()
	})
	return nil
}

// Output is what Drain collected.
type Output struct {
	Stdout, Stderr, PTY []byte
	End                 EndEvent
}

// Drain reads the stream to its end and closes it. It fails when the
// stream ends without an end event: an exit is never invented.
func (s *Stream) Drain() (Output, error) {
	defer s.Close()
	var out Output
	var end *EndEvent
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			if end == nil {
				return out, fail(s.op, 0, unavailable("stream ended without an end event"))
			}
			out.End = *end
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out.Stdout = append(out.Stdout, ev.Stdout...)
		out.Stderr = append(out.Stderr, ev.Stderr...)
		out.PTY = append(out.PTY, ev.PTY...)
		if ev.End != nil {
			end = ev.End
		}
	}
}
