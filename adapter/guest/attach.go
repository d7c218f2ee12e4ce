package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/wire"
)

// leaseMargin is how much longer than its lease an attach process may
// live in the guest (the Executor's lifetime): runner-shim ends it by the
// lease, the provider by the lifetime.
const leaseMargin = 30 * time.Second

// errClosed is a dial after Close.
var errClosed = errors.New("guest closed")

// dial starts one runner-shim attach --ack --lease in the guest from the
// cursor and reads its first frame: a heartbeat (the ack) gives a Conn;
// the one error frame of a refusal is the answer (not_found for an
// unknown session: definitive, the guest's shim is its registry). ctx
// bounds only the wait for that first frame; the attach process lives by
// the Guest's context and its lease.
func (g *Guest) dial(ctx context.Context, root, id string, from adapter.Cursor) (stream.Conn, error) {
	argv := []string{g.cfg.Shim, "--root", root, "attach", "--ack",
		"--lease", g.cfg.Lease.String(), "--heartbeat", g.cfg.Heartbeat.String(),
		"--stdout", strconv.FormatInt(from.Stdout, 10), "--stderr", strconv.FormatInt(from.Stderr, 10)}
	if g.cfg.TextSafe {
		argv = append(argv, "--base64")
	}
	argv = append(argv, id)

	g.runMu.Lock()
	if g.closed {
		g.runMu.Unlock()
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("attach %s: %v", id, errClosed)}
	}
	g.wg.Add(1)
	g.runMu.Unlock()
	ectx, cancel := context.WithCancel(g.ctx)
	pr, pw := io.Pipe()
	// A pipe write blocks until it is read, whatever ectx says: once the
	// attach is cancelled (its Conn closed, or the Guest closed) nobody
	// reads, so the read side is closed too and the executor's write to
	// stdout fails instead of holding the execution (and Close) forever.
	context.AfterFunc(ectx, func() { pr.CloseWithError(ectx.Err()) })
	// The attach execution, owned by the Guest (Close waits for it). It
	// ends when the attach ends (its terminal frame, its lease) or when
	// its Conn is closed (cancel).
	go func() {
		defer g.wg.Done()
		status, err := g.cfg.Exec.Exec(ectx, argv, nil, pw, g.cfg.Lease+leaseMargin)
		if err == nil {
			err = &attachEnd{status: status}
		}
		pw.CloseWithError(err)
	}()
	stopAll := func() { cancel(); pr.Close() }

	fr := newFrameReader(pr, g.cfg.TextSafe)
	stop := context.AfterFunc(ctx, func() { cancel(); pr.CloseWithError(ctx.Err()) })
	raw, err := fr.next()
	stop()
	if err != nil {
		stopAll()
		var end *attachEnd
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("attach %s: %w", id, ctx.Err())
		case errors.As(err, &end) && end.status == 127:
			return nil, &adapter.ProviderError{Provider: g.cfg.Provider, Detail: fmt.Sprintf("attach %s: %s not found in the guest", id, g.cfg.Shim)}
		case errors.As(err, &end):
			return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("attach %s: runner-shim exited with status %d before its first frame", id, end.status)}
		case errors.Is(err, errBadFrame), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
			// Cut or mangled bytes: nothing is proved.
			return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("attach %s: %v", id, err)}
		}
		return nil, fmt.Errorf("attach %s: %w", id, err)
	}
	f, err := wire.ParseFrame(raw)
	if err != nil {
		stopAll()
		return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("attach %s: first frame: %v", id, err)}
	}
	rest := fr.rest()
	switch f.Kind {
	case wire.FrameHeartbeat:
	case wire.FrameError:
		stopAll()
		we, err := f.Err()
		if err != nil {
			return nil, &adapter.UnavailableError{Detail: fmt.Sprintf("attach %s: decode error frame: %v", id, err)}
		}
		return nil, g.refusal(id, we)
	default:
		// Not acknowledged first (an older shim): the frame is the
		// stream's first.
		rest = io.MultiReader(bytes.NewReader(raw), rest)
	}
	op := "session " + id
	conn := stream.NewDecoderConn(op, readCloser{Reader: rest, close: stopAll}, from)
	return leaseConn{Conn: conn, op: op}, nil
}

// refusal maps the error frame that refused an attach. Unlike an error
// frame inside a stream (stream.FrameError), a refusal by the guest's own
// shim of an unknown session is definitive.
func (g *Guest) refusal(id string, we *wire.Error) error {
	what := "attach " + id
	switch {
	case isLeaseEnd(we):
		return &adapter.UnavailableError{Detail: what + ": lease ended before the first frame"}
	case we.Code == wire.CodeNotFound:
		return fmt.Errorf("%s: %s: %w", what, we.Detail, adapter.ErrNotFound)
	}
	return g.answerError(what, we)
}

// isLeaseEnd reports whether we is the end of a bounded attach
// (wire.ShimDetailLeaseEnded).
func isLeaseEnd(we *wire.Error) bool {
	return we.Code == wire.CodeUnavailable && strings.HasPrefix(we.Detail, wire.ShimDetailLeaseEnded+":")
}

// leaseConn turns a lease's end into a cut, so adapter/stream attaches
// again from its cursors: the consumer never sees it.
type leaseConn struct {
	stream.Conn
	op string
}

func (c leaseConn) Next() (wire.Frame, error) {
	f, err := c.Conn.Next()
	if err == nil && f.Kind == wire.FrameError {
		if we, derr := f.Err(); derr == nil && isLeaseEnd(we) {
			return wire.Frame{}, &adapter.UnavailableError{Detail: c.op + ": attach lease ended"}
		}
	}
	return f, err
}

// attachEnd is an attach execution that ended (its status); read after
// the last frame it is the stream's EOF.
type attachEnd struct{ status int }

func (e *attachEnd) Error() string {
	return fmt.Sprintf("runner-shim attach exited with status %d", e.status)
}

// readCloser is the Conn's byte source; close stops the attach execution.
type readCloser struct {
	io.Reader
	close func()
}

func (r readCloser) Read(p []byte) (int, error) {
	n, err := r.Reader.Read(p)
	var end *attachEnd
	if errors.As(err, &end) {
		err = io.EOF // the decoder judges a missing terminal frame
	}
	return n, err
}

func (r readCloser) Close() error { r.close(); return nil }

// errBadFrame is a first frame that is not one.
var errBadFrame = errors.New("not a frame stream")

// frameReader reads raw frames from an attach's stdout, binary or base64
// lines, and hands over the rest as a binary frame byte stream.
type frameReader struct {
	br   *bufio.Reader
	text bool
}

func newFrameReader(r io.Reader, text bool) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(r, 64<<10), text: text}
}

// next returns one frame's bytes.
func (fr *frameReader) next() ([]byte, error) {
	if fr.text {
		return readB64Line(fr.br)
	}
	h := make([]byte, wire.FrameHeaderLen)
	if _, err := io.ReadFull(fr.br, h); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: cut inside the first header", errBadFrame)
		}
		return nil, err
	}
	n := wire.PayloadLen(h)
	if n > wire.MaxFramePayload {
		return nil, fmt.Errorf("%w: payload of %d bytes", errBadFrame, n)
	}
	b := make([]byte, wire.FrameHeaderLen+n)
	copy(b, h)
	if _, err := io.ReadFull(fr.br, b[wire.FrameHeaderLen:]); err != nil {
		return nil, fmt.Errorf("%w: cut inside the first frame: %v", errBadFrame, err)
	}
	return b, nil
}

// rest returns what follows as binary frame bytes.
func (fr *frameReader) rest() io.Reader {
	if fr.text {
		return &b64Reader{br: fr.br}
	}
	return fr.br
}

// maxB64Line bounds one base64 line: a whole frame, encoded.
const maxB64Line = (wire.FrameHeaderLen+wire.MaxFramePayload+2)/3*4 + 2

// readB64Line reads and decodes one line. A line cut by the end of the
// output is io.ErrUnexpectedEOF.
func readB64Line(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxB64Line {
			return nil, fmt.Errorf("%w: base64 line longer than a frame", errBadFrame)
		}
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(line) > 0 && errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		if len(line) > 0 {
			var end *attachEnd
			if errors.As(err, &end) {
				return nil, io.ErrUnexpectedEOF
			}
		}
		return nil, err
	}
	b, err := base64.StdEncoding.AppendDecode(nil, bytes.TrimRight(line, "\r\n"))
	if err != nil {
		return nil, fmt.Errorf("%w: base64: %v", errBadFrame, err)
	}
	return b, nil
}

// b64Reader decodes base64 lines into the binary frame stream.
type b64Reader struct {
	br  *bufio.Reader
	buf []byte
}

func (r *b64Reader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		b, err := readB64Line(r.br)
		if err != nil {
			return 0, err
		}
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
