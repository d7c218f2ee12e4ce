package stream

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// NewDecoderConn returns a Conn that decodes the frame byte stream of rc
// (docs/frames.md): what `runner-shim attach` writes to its stdout, read
// through a hosted provider's exec or file API. from is the cursor the
// attach was started at. Next skips heartbeats and reports, as
// *adapter.UnavailableError, every way the bytes can fail to be a whole
// stream: an end (EOF or a read error) before the terminal frame, an
// undecodable frame, and data that is not contiguous per stream from
// from. After the terminal frame Next returns io.EOF. Close closes rc.
func NewDecoderConn(op string, rc io.ReadCloser, from adapter.Cursor) Conn {
	return &decoderConn{op: op, rc: rc, dec: wire.NewDecoder(rc),
		want: map[wire.StreamID]int64{wire.StreamStdout: from.Stdout, wire.StreamStderr: from.Stderr}}
}

type decoderConn struct {
	op   string
	rc   io.ReadCloser
	dec  *wire.Decoder
	once sync.Once // guards closing rc

	// Next's alone:
	want map[wire.StreamID]int64
	done bool
	err  error
}

func (c *decoderConn) Next() (wire.Frame, error) {
	if c.done {
		return wire.Frame{}, io.EOF
	}
	if c.err != nil {
		return wire.Frame{}, c.err
	}
	for {
		f, err := c.dec.Next()
		switch {
		case errors.Is(err, io.EOF):
			c.err = &adapter.UnavailableError{Detail: c.op + ": stream ended without a terminal frame"}
		case err != nil:
			c.err = &adapter.UnavailableError{Detail: fmt.Sprintf("%s: read frame: %v", c.op, err)}
		}
		if c.err != nil {
			c.Close()
			return wire.Frame{}, c.err
		}
		switch {
		case f.Kind == wire.FrameHeartbeat:
			continue
		case f.Kind == wire.FrameData:
			if want := c.want[f.Stream]; f.Offset != want {
				c.err = &adapter.UnavailableError{Detail: fmt.Sprintf("%s: %s data at offset %d, want %d: the stream is not contiguous", c.op, f.Stream.StreamName(), f.Offset, want)}
				c.Close()
				return wire.Frame{}, c.err
			}
			c.want[f.Stream] = f.End()
			// The decoder reuses its buffer; the consumer keeps the bytes.
			f.Payload = append([]byte(nil), f.Payload...)
		case f.Kind.Terminal():
			f.Payload = append([]byte(nil), f.Payload...)
			c.done = true
			c.Close()
		}
		return f, nil
	}
}

func (c *decoderConn) Close() error {
	c.once.Do(func() { c.rc.Close() })
	return nil
}
