package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/wire"
)

// Cursors are the byte offsets an attach starts at, per stream. The zero
// value replays from byte zero.
type Cursors struct {
	Stdout int64
	Stderr int64
}

// FrameReader reads the frames of one WebSocket attach (docs/protocol.md,
// "attach"). Next returns data frames and then exactly one terminal frame
// (exit, lost or error); heartbeats are consumed internally. A connection
// that ends without a terminal frame is *adapter.UnavailableError from
// Next: a transport failure, never an exit; reattach from the cursors.
//
// Next must be called from one goroutine; Close may be called from any
// goroutine, any number of times, and unblocks a pending Next. The caller
// must Close every FrameReader.
type FrameReader struct {
	conn   *websocket.Conn
	op     string
	next   func() (websocket.MessageType, []byte, error) // one read under the heartbeat deadline
	ctx    context.Context                               // ends on Close
	cancel context.CancelFunc
	once   sync.Once
	done   bool  // a terminal frame was returned (Next's goroutine only)
	err    error // sticky error (Next's goroutine only)
	// next offset expected on each stream, indexed by wire.StreamID
	// (Next's goroutine only): data must continue exactly where the
	// cursor, or the previous frame, ended.
	want [3]int64
}

// Attach opens a WebSocket attach to session id of sandbox, replaying each
// stream from cur. ctx bounds the handshake only; the FrameReader lives
// until its terminal frame or Close. Errors before the upgrade are
// classified like any call: adapter.ErrNotFound (no such sandbox or
// session), adapter.ErrTruncated (a cursor behind retained data),
// *adapter.InvalidError (a cursor beyond the end).
func (c *Client) Attach(ctx context.Context, sandbox, id string, cur Cursors) (*FrameReader, error) {
	path := apiPath("sandboxes", sandbox, "sessions", id, "attach")
	op := "GET " + path
	q := url.Values{}
	q.Set("stdout", strconv.FormatInt(cur.Stdout, 10))
	if cur.Stderr != 0 {
		q.Set("stderr", strconv.FormatInt(cur.Stderr, 10))
	}
	h := http.Header{}
	c.header(h, false)
	h.Del("Accept")
	dctx, dcancel := context.WithTimeout(ctx, c.opts.RequestTimeout)
	defer dcancel()
	conn, resp, err := websocket.Dial(dctx, c.url(path, scopedQuery(ctx, path, q)), &websocket.DialOptions{
		HTTPClient:      c.hc,
		HTTPHeader:      h,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.StatusCode != 0 {
			return nil, responseErr(ctx, op, resp)
		}
		return nil, transportErr(ctx, op, err)
	}
	conn.SetReadLimit(wire.FrameHeaderLen + wire.MaxFramePayload)
	rctx, cancel := context.WithCancel(context.Background())
	fr := &FrameReader{conn: conn, op: op, ctx: rctx, cancel: cancel,
		want: [3]int64{wire.StreamStdout: cur.Stdout, wire.StreamStderr: cur.Stderr}}
	hb := c.opts.HeartbeatTimeout
	fr.next = func() (websocket.MessageType, []byte, error) {
		nctx, ncancel := context.WithTimeout(rctx, hb)
		defer ncancel()
		typ, rd, err := conn.Reader(nctx)
		if err != nil {
			return 0, nil, err
		}
		b, err := readMessage(rd)
		return typ, b, err
	}
	return fr, nil
}

// readMessage reads one WebSocket message that should hold one frame. It
// sizes the buffer from the frame header, so a 64 KiB data frame costs one
// allocation of exactly its size (the payload is handed to the caller),
// where conn.Read grows a slice by doubling: about eighty allocations and
// twice the garbage per frame, measured as the client's largest CPU cost
// in docs/benchmarks.md. Validation is ParseFrame's: a message that is not
// exactly one frame comes back whole or cut, and ParseFrame rejects it.
func readMessage(rd io.Reader) ([]byte, error) {
	var hdr [wire.FrameHeaderLen]byte
	got, err := io.ReadFull(rd, hdr[:])
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return hdr[:got], nil // too short to be a frame
	}
	if err != nil {
		return nil, err
	}
	n := wire.PayloadLen(hdr[:])
	if n > wire.MaxFramePayload {
		return hdr[:], nil // ParseFrame reports the oversized length
	}
	b := make([]byte, wire.FrameHeaderLen+n)
	copy(b, hdr[:])
	got, err = io.ReadFull(rd, b[wire.FrameHeaderLen:])
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return b[:wire.FrameHeaderLen+got], nil // cut: ParseFrame says so
	}
	if err != nil {
		return nil, err
	}
	// The message must end here; trailing bytes make it no frame at all.
	var one [1]byte
	if m, _ := io.ReadFull(rd, one[:]); m > 0 {
		return append(b, one[0]), nil
	}
	return b, nil
}

// Next returns the next frame. After the terminal frame it returns io.EOF.
// Payloads are owned by the caller. A heartbeat silence longer than
// Options.HeartbeatTimeout, a close without a terminal frame, or an
// undecodable message is *adapter.UnavailableError; after Close it is
// net.ErrClosed wrapped.
func (r *FrameReader) Next() (wire.Frame, error) {
	if r.done {
		return wire.Frame{}, io.EOF
	}
	if r.err != nil {
		return wire.Frame{}, r.err
	}
	for {
		typ, b, err := r.next()
		if err != nil {
			r.err = r.readErr(err)
			r.conn.CloseNow()
			return wire.Frame{}, r.err
		}
		if typ != websocket.MessageBinary {
			continue // the protocol sends binary only; ignore anything else
		}
		f, err := wire.ParseFrame(b)
		if err != nil {
			r.err = unavailablef("%s: decode frame: %v", r.op, err)
			r.conn.CloseNow()
			return wire.Frame{}, r.err
		}
		if f.Kind == wire.FrameHeartbeat {
			continue
		}
		if f.Kind == wire.FrameData {
			// A gap or an overlap (a proxy, a bug) would silently lose or
			// repeat transcript bytes: it is a transport failure, and the
			// caller reattaches from what it has.
			if want := r.want[f.Stream]; f.Offset != want {
				r.err = unavailablef("%s: %s data at offset %d, want %d: the stream is not contiguous", r.op, f.Stream.StreamName(), f.Offset, want)
				r.conn.CloseNow()
				return wire.Frame{}, r.err
			}
			r.want[f.Stream] = f.End()
		}
		if f.Kind.Terminal() {
			r.done = true
			// The server closes with 1000 after the terminal frame; we
			// need nothing more from it.
			r.conn.Close(websocket.StatusNormalClosure, "")
		}
		return f, nil
	}
}

// Cursors returns where each stream continues after the data frames Next
// has returned: the cursors r was opened with, advanced by every frame.
// Call it from Next's goroutine, or once Next is done; it is what to
// attach again from after a transport failure.
func (r *FrameReader) Cursors() Cursors {
	return Cursors{Stdout: r.want[wire.StreamStdout], Stderr: r.want[wire.StreamStderr]}
}

func (r *FrameReader) readErr(err error) error {
	if r.ctx.Err() != nil {
		return fmt.Errorf("%s: %w", r.op, errReaderClosed)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return unavailablef("%s: no frame or heartbeat for too long: the daemon or the network is gone", r.op)
	}
	if s := websocket.CloseStatus(err); s != -1 {
		return unavailablef("%s: connection closed (%d %s) without a terminal frame", r.op, s, s)
	}
	return unavailablef("%s: connection ended without a terminal frame: %v", r.op, err)
}

// A FrameReader is the Conn the Adapter's streams read (adapter/stream).
var _ stream.Conn = (*FrameReader)(nil)

// errReaderClosed is what Next returns after Close.
var errReaderClosed = errors.New("frame reader closed")

// Close ends the attach (the session keeps running). It is idempotent.
func (r *FrameReader) Close() error {
	r.once.Do(func() {
		r.cancel()
		r.conn.CloseNow()
	})
	return nil
}

// StreamEnd is how a plain stream body ended (its trailers, or the headers
// of a session that had ended before the request).
type StreamEnd struct {
	// How is "exit", "lost", "more" or "error" (Runner-Stream-End).
	How string
	// Exit is the exit record when How is "exit" or "lost".
	Exit *wire.Exit
	// Err is the classified error when How is "error".
	Err error
}

// StreamBody is the body of GET .../streams/{stream}: the raw bytes of one
// stream. Read it to io.EOF, then call End for how it ended. It takes both
// forms runnerd answers in (docs/protocol.md): a session that had ended
// before the request gets a Content-Length body with its end in the
// headers; a running one gets a chunked body with its end in trailers. A
// body cut short of its Content-Length, or ending without the trailer,
// makes Read or End return *adapter.UnavailableError: a transport
// failure, never an exit. The caller must Close it.
type StreamBody struct {
	resp  *http.Response
	op    string
	ended bool // the ended form: end in the headers, a Content-Length body
	n     int64
	eof   bool
	once  sync.Once
}

// Stream opens the plain byte stream of one stream ("stdout" or "stderr")
// of a session from cursor. follow keeps the body open until the session
// ends; without it the body ends at the current length (End says "more"
// while the session runs). ctx bounds the whole body.
func (c *Client) Stream(ctx context.Context, sandbox, id, stream string, cursor int64, follow bool) (*StreamBody, error) {
	path := apiPath("sandboxes", sandbox, "sessions", id, "streams", stream)
	op := "GET " + path
	q := url.Values{}
	q.Set("cursor", strconv.FormatInt(cursor, 10))
	if follow {
		q.Set("follow", "1")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url(path, scopedQuery(ctx, path, q)), nil)
	if err != nil {
		return nil, invalidf("%s: %v", op, err)
	}
	c.header(req.Header, false)
	req.Header.Set("Accept", "application/octet-stream")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, transportErr(ctx, op, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, responseErr(ctx, op, resp)
	}
	b := &StreamBody{resp: resp, op: op, ended: resp.Header.Get(wire.HeaderStreamEnd) != ""}
	if b.ended && resp.ContentLength < 0 {
		// The end is already known, so only the length can tell a whole
		// body from a cut one; without it (a proxy re-framed the body)
		// nothing received could be trusted to be the end.
		resp.Body.Close()
		return nil, unavailablef("%s: %s header without a Content-Length: cannot tell a whole body from a cut one", op, wire.HeaderStreamEnd)
	}
	return b, nil
}

// Read reads stream bytes.
func (b *StreamBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.resp.Body.Read(p)
	b.n += int64(n)
	if err == io.EOF {
		if cerr := b.cut(); cerr != nil {
			return n, cerr
		}
		b.eof = true
		return n, io.EOF
	}
	if err != nil {
		// net/http reports a Content-Length body that ends short as
		// io.ErrUnexpectedEOF, and a chunked one cut before its last
		// chunk the same way: both land here.
		return n, unavailablef("%s: read body: %v", b.op, err)
	}
	return n, nil
}

// cut says why a body that reached EOF is not whole, or nil.
func (b *StreamBody) cut() error {
	if b.ended {
		if b.n != b.resp.ContentLength {
			return unavailablef("%s: body ended after %d of its %d bytes: cut", b.op, b.n, b.resp.ContentLength)
		}
		return nil
	}
	if b.resp.Trailer.Get(wire.HeaderStreamEnd) == "" {
		return unavailablef("%s: body ended without the %s trailer: cut", b.op, wire.HeaderStreamEnd)
	}
	return nil
}

// N returns the bytes read so far: cursor + N is where to continue.
func (b *StreamBody) N() int64 { return b.n }

// End returns how the body ended once Read returned io.EOF: from the
// headers of the ended form, or from the trailers of the running form
// (never a mix: a running form's headers do not say how its body ended).
func (b *StreamBody) End() (StreamEnd, error) {
	if !b.eof {
		return StreamEnd{}, invalidf("%s: End before the body was read to EOF", b.op)
	}
	src := b.resp.Trailer
	if b.ended {
		src = b.resp.Header
	}
	end := StreamEnd{How: src.Get(wire.HeaderStreamEnd)}
	switch end.How {
	case "exit", "lost":
		raw := src.Get(wire.HeaderExit)
		if raw == "" {
			return end, unavailablef("%s: %s %q without %s", b.op, wire.HeaderStreamEnd, end.How, wire.HeaderExit)
		}
		e, err := decodeExit([]byte(raw))
		if err != nil {
			return end, unavailablef("%s: decode %s: %v", b.op, wire.HeaderExit, err)
		}
		end.Exit = &e
	case "more":
	case "error":
		code := wire.Code(src.Get(wire.HeaderError))
		end.Err = stream.FrameError(Provider, b.op, &wire.Error{Code: code})
	case "":
		return end, unavailablef("%s: body ended without the %s trailer: cut", b.op, wire.HeaderStreamEnd)
	default:
		return end, unavailablef("%s: unknown %s %q", b.op, wire.HeaderStreamEnd, end.How)
	}
	return end, nil
}

// Close closes the body. It is idempotent.
func (b *StreamBody) Close() error {
	b.once.Do(func() { b.resp.Body.Close() })
	return nil
}
