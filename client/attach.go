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
	"time"

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
	// known says which entries of want are known: all for a cursor
	// attach; for a since attach, a stream's start is learned from its
	// first data frame (Next's goroutine only).
	known [3]bool
	start [3]int64  // where each known stream began (Next's goroutine only)
	since time.Time // the time a since attach asked for, or zero
}

// Attach opens a WebSocket attach to session id of sandbox, replaying each
// stream from cur. ctx bounds the handshake only; the FrameReader lives
// until its terminal frame or Close. Errors before the upgrade are
// classified like any call: adapter.ErrNotFound (no such sandbox or
// session), adapter.ErrTruncated (a cursor behind retained data),
// *adapter.InvalidError (a cursor beyond the end).
func (c *Client) Attach(ctx context.Context, sandbox, id string, cur Cursors) (*FrameReader, error) {
	return c.attach(ctx, sandbox, id, cur, time.Time{})
}

// AttachSince opens a WebSocket attach to session id of sandbox that
// starts each stream at the first byte written at or after since
// (wire.QuerySince: it may start up to wire.SinceGranularity earlier,
// never later). The data frames carry their offsets, so the FrameReader
// learns each stream's start from its first frame (Start) and keeps byte
// cursors from there: reattach after a transport failure with Reattach,
// which continues by cursor, not by time. Errors are Attach's.
func (c *Client) AttachSince(ctx context.Context, sandbox, id string, since time.Time) (*FrameReader, error) {
	return c.attach(ctx, sandbox, id, Cursors{}, since)
}

// Reattach opens a new attach that continues where prev ended, by cursor
// (prev.Cursors). A stream of a since attach on which prev received no
// data frame has no cursor yet: Reattach first resolves prev's time to
// one through the stream endpoint (StreamSince's Start, the same
// resolution the attach made; runnerd takes no cursor and time together),
// so the new attach is by cursor only. Errors are Attach's, or Session's
// and StreamSince's while resolving.
func (c *Client) Reattach(ctx context.Context, sandbox, id string, prev *FrameReader) (*FrameReader, error) {
	cur := prev.Cursors()
	if !prev.known[wire.StreamStdout] || !prev.known[wire.StreamStderr] {
		s, err := c.Session(ctx, sandbox, id)
		if err != nil {
			return nil, err
		}
		for _, name := range s.Streams {
			sid := wire.StreamStdout
			if name == "stderr" {
				sid = wire.StreamStderr
			}
			if prev.known[sid] {
				continue
			}
			b, err := c.StreamSince(ctx, sandbox, id, name, prev.since, false)
			if err != nil {
				return nil, err
			}
			b.Close() // only the start is needed, not the body
			if sid == wire.StreamStdout {
				cur.Stdout = b.Start()
			} else {
				cur.Stderr = b.Start()
			}
		}
	}
	return c.Attach(ctx, sandbox, id, cur)
}

// attach asks every stream by cursor when since is zero, and every one
// by time otherwise (runnerd takes no cursor and time together).
func (c *Client) attach(ctx context.Context, sandbox, id string, cur Cursors, since time.Time) (*FrameReader, error) {
	path := apiPath("sandboxes", sandbox, "sessions", id, "attach")
	op := "GET " + path
	q := url.Values{}
	bySince := !since.IsZero()
	if bySince {
		q.Set(wire.QuerySince, since.Format(time.RFC3339Nano))
	} else {
		q.Set("stdout", strconv.FormatInt(cur.Stdout, 10))
		if cur.Stderr != 0 {
			q.Set("stderr", strconv.FormatInt(cur.Stderr, 10))
		}
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
		want:  [3]int64{wire.StreamStdout: cur.Stdout, wire.StreamStderr: cur.Stderr},
		known: [3]bool{wire.StreamStdout: !bySince, wire.StreamStderr: !bySince},
		start: [3]int64{wire.StreamStdout: cur.Stdout, wire.StreamStderr: cur.Stderr}}
	if bySince {
		fr.since = since
	}
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
			if !r.known[f.Stream] {
				// A since attach: the first frame says where the time
				// resolved to, and the stream is contiguous from there.
				r.want[f.Stream], r.start[f.Stream], r.known[f.Stream] = f.Offset, f.Offset, true
			}
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
// attach again from after a transport failure. A stream of a since attach
// with no data frame yet reports 0, which is no cursor (see Start); use
// Reattach to continue such a reader.
func (r *FrameReader) Cursors() Cursors {
	return Cursors{Stdout: r.want[wire.StreamStdout], Stderr: r.want[wire.StreamStderr]}
}

// Start returns the offset at which the attach's data on stream begins
// (a data frame continues from there), and whether it is known: always
// for a cursor attach; for a since attach only once a data frame of that
// stream has arrived. Call it from Next's goroutine, or once Next is done.
func (r *FrameReader) Start(stream wire.StreamID) (int64, bool) {
	if stream != wire.StreamStdout && stream != wire.StreamStderr {
		return 0, false
	}
	return r.start[stream], r.known[stream]
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
	ended bool  // the ended form: end in the headers, a Content-Length body
	start int64 // offset of the body's first byte
	n     int64
	eof   bool
	once  sync.Once
}

// Stream opens the plain byte stream of one stream ("stdout" or "stderr")
// of a session from cursor. follow keeps the body open until the session
// ends; without it the body ends at the current length (End says "more"
// while the session runs). ctx bounds the whole body.
func (c *Client) Stream(ctx context.Context, sandbox, id, stream string, cursor int64, follow bool) (*StreamBody, error) {
	return c.stream(ctx, sandbox, id, stream, cursor, time.Time{}, follow)
}

// StreamSince is Stream starting at the first byte written at or after
// since instead of at a cursor (wire.QuerySince: it may start up to
// wire.SinceGranularity earlier, never later). The body's Start is the
// offset its first byte has (the Runner-Stream-Start header), so
// Start + N is the byte cursor to continue from with Stream.
func (c *Client) StreamSince(ctx context.Context, sandbox, id, stream string, since time.Time, follow bool) (*StreamBody, error) {
	return c.stream(ctx, sandbox, id, stream, 0, since, follow)
}

func (c *Client) stream(ctx context.Context, sandbox, id, stream string, cursor int64, since time.Time, follow bool) (*StreamBody, error) {
	path := apiPath("sandboxes", sandbox, "sessions", id, "streams", stream)
	op := "GET " + path
	q := url.Values{}
	if since.IsZero() {
		q.Set("cursor", strconv.FormatInt(cursor, 10))
	} else {
		q.Set(wire.QuerySince, since.Format(time.RFC3339Nano))
	}
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
	b := &StreamBody{resp: resp, op: op, ended: resp.Header.Get(wire.HeaderStreamEnd) != "", start: cursor}
	if raw := resp.Header.Get(wire.HeaderStreamStart); raw != "" || !since.IsZero() {
		start, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || start < 0 || (since.IsZero() && start != cursor) {
			// Without a trustworthy start a reader by time could keep
			// no cursor, and one by cursor would be told another place.
			resp.Body.Close()
			return nil, unavailablef("%s: %s %q: want the offset of the first byte", op, wire.HeaderStreamStart, raw)
		}
		b.start = start
	}
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

// N returns the bytes read so far: Start + N is where to continue.
func (b *StreamBody) N() int64 { return b.n }

// Start returns the offset of the body's first byte: the cursor asked
// for, or what a StreamSince time resolved to (Runner-Stream-Start).
func (b *StreamBody) Start() int64 { return b.start }

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
