package adapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
)

// StreamName names one output stream of a session.
type StreamName string

const (
	// Stdout is the command's standard output. A TTY session has only this
	// stream, because a terminal has one.
	Stdout StreamName = "stdout"
	// Stderr is the command's standard error (pipes mode only).
	Stderr StreamName = "stderr"
)

// ExitReason says why a command ended.
type ExitReason string

const (
	// ReasonExited: the command exited on its own; Code is its status
	// (0-255) and Signal is empty.
	ReasonExited ExitReason = "exited"
	// ReasonSignaled: the command was killed by a signal nobody asked the
	// contract to send; Code is -1 and Signal names it.
	ReasonSignaled ExitReason = "signaled"
	// ReasonTerminated: the command ended after [Adapter.TerminateSession],
	// [Adapter.Suspend] or [Adapter.Destroy] asked it to stop. Code and
	// Signal follow the same rule: a signal death has Code -1.
	ReasonTerminated ExitReason = "terminated"
)

// Exit is a command's true end. A death by signal is never an exit code:
// Signal is non-empty if and only if Code is -1, so a killed command can
// never read as success. Use [Exit.Success] rather than comparing Code.
type Exit struct {
	// Code is the exit status 0-255, or -1 when a signal ended the command.
	Code int
	// Signal is the signal name ("SIGTERM", "SIGKILL") when a signal ended
	// the command, else "".
	Signal string
	// Reason says why the command ended.
	Reason ExitReason
}

// Success reports whether the command exited on its own accord with status 0.
func (e Exit) Success() bool { return e.Code == 0 && e.Signal == "" }

// Valid reports whether e obeys the invariants above: a reason is set, a
// signal death has Code -1, and an exit status is within 0-255.
func (e Exit) Valid() bool {
	switch e.Reason {
	case ReasonExited:
		return e.Signal == "" && e.Code >= 0 && e.Code <= 255
	case ReasonSignaled:
		return e.Signal != "" && e.Code == -1
	case ReasonTerminated:
		if e.Signal != "" {
			return e.Code == -1
		}
		return e.Code >= 0 && e.Code <= 255
	}
	return false
}

func (e Exit) String() string {
	if e.Signal != "" {
		return fmt.Sprintf("%s (%s)", e.Reason, e.Signal)
	}
	return fmt.Sprintf("%s (code %d)", e.Reason, e.Code)
}

// Frame is one event on a session's stream. A data frame has Stream, Offset
// and Data set; a terminal frame has exactly one of Exit or Err set and no
// data.
//
// Per stream, data frames are contiguous: the first frame's Offset is the
// cursor the stream was opened at, and each next frame's Offset is the
// previous Offset plus len(Data). A caller that persisted N bytes of a
// stream resumes from N and loses and duplicates nothing.
//
// Exactly one terminal frame ends every [Stream] that is not closed by its
// consumer, and no frame follows it:
//   - Exit: the command ended; this is its true exit.
//   - Err: the stream ended without the command's exit being known to this
//     stream. An *UnavailableError means the transport broke (the command
//     may still be running: attach again from the cursor); ErrLost means
//     the command ended without an exit record. Err is never an exit code,
//     and a caller must never treat it as one.
type Frame struct {
	Stream StreamName
	Offset int64
	Data   []byte
	Exit   *Exit
	Err    error
}

// Terminal reports whether f ends its stream.
func (f Frame) Terminal() bool { return f.Exit != nil || f.Err != nil }

func (f Frame) String() string {
	switch {
	case f.Exit != nil:
		return "exit " + f.Exit.String()
	case f.Err != nil:
		return "error " + f.Err.Error()
	}
	return string(f.Stream) + "@" + strconv.FormatInt(f.Offset, 10) + " " + strconv.Quote(string(f.Data))
}

// Cursor is where an attach starts, per stream: the number of bytes of each
// stream the caller already has. The zero Cursor replays from byte zero.
type Cursor struct {
	Stdout int64
	Stderr int64
}

// At returns the cursor position of stream s.
func (c Cursor) At(s StreamName) int64 {
	if s == Stderr {
		return c.Stderr
	}
	return c.Stdout
}

// Advance moves the cursor past a data frame; terminal frames leave it as is.
func (c *Cursor) Advance(f Frame) {
	switch f.Stream {
	case Stdout:
		c.Stdout = f.Offset + int64(len(f.Data))
	case Stderr:
		c.Stderr = f.Offset + int64(len(f.Data))
	}
}

// Stream is the consumer's side of a spawned or attached session.
//
// Frames are delivered on a bounded channel: a consumer that reads slowly
// slows only its own transport, never the command. The channel is closed
// after the terminal frame, or after Close.
//
// A Stream is safe for concurrent use: one goroutine may range over Frames
// while another calls Close. Whoever obtains a Stream must Close it.
type Stream interface {
	// SessionID is the session's id, for Attach, WriteStdin and the rest.
	SessionID() string
	// Frames returns the frame channel; every call returns the same channel.
	Frames() <-chan Frame
	// Close detaches the local transport only: the session keeps running
	// and can be attached again. It delivers no terminal frame. Close is
	// idempotent and returns nil.
	Close() error
}

// Feed is a [Stream] for adapter authors: the adapter's producer goroutine
// sends frames with [Feed.Send] and the consumer reads Frames. Feed enforces
// nothing about frame order; that is the adapter's job, and the conformance
// suite's to check.
//
// Send and Stop must be called from one producer goroutine. Close may be
// called from any goroutine, any number of times.
type Feed struct {
	id    string
	ch    chan Frame
	done  chan struct{}
	once  sync.Once // guards closing done
	sent  sync.Once // guards closing ch
	close func()    // called once on consumer Close, may be nil
}

// NewFeed returns a Feed for session id whose channel holds buffer frames
// (minimum 1). onClose, if not nil, is called once when the consumer closes
// the Feed, for example to tear down a connection; it must not block.
func NewFeed(id string, buffer int, onClose func()) *Feed {
	if buffer < 1 {
		buffer = 1
	}
	return &Feed{id: id, ch: make(chan Frame, buffer), done: make(chan struct{}), close: onClose}
}

// ErrDetached is returned by [Feed.Send] after the consumer closed the Feed.
// It never reaches a Stream's consumer.
var ErrDetached = errors.New("stream detached by its consumer")

// SessionID returns the session id given to NewFeed.
func (f *Feed) SessionID() string { return f.id }

// Frames returns the frame channel.
func (f *Feed) Frames() <-chan Frame { return f.ch }

// Done is closed when the consumer closes the Feed. A producer that waits
// for more output selects on it, then calls Stop.
func (f *Feed) Done() <-chan struct{} { return f.done }

// Close detaches the consumer. It is idempotent.
func (f *Feed) Close() error {
	f.once.Do(func() {
		close(f.done)
		if f.close != nil {
			f.close()
		}
	})
	return nil
}

// Send delivers fr, blocking while the channel is full. It returns
// ErrDetached (and closes the channel) once the consumer has closed the
// Feed, or ctx.Err() when ctx ends first. After a terminal frame is
// delivered the channel is closed; the producer sends nothing more.
func (f *Feed) Send(ctx context.Context, fr Frame) error {
	select {
	case <-f.done:
		f.Stop()
		return ErrDetached
	default:
	}
	select {
	case f.ch <- fr:
		if fr.Terminal() {
			f.Stop()
		}
		return nil
	case <-f.done:
		f.Stop()
		return ErrDetached
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop closes the frame channel without a terminal frame. A producer calls
// it when it gives up after the consumer detached. It is idempotent.
func (f *Feed) Stop() { f.sent.Do(func() { close(f.ch) }) }

var _ Stream = (*Feed)(nil)
