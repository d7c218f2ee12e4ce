package launch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// Client talks to one session's shim over its control socket, and answers
// from the session directory once the shim is gone (ErrExited with the exit
// record, or ErrLost).
//
// A Client is safe for concurrent use. Stdin operations (WriteStdin,
// CloseStdin) use their own connection and are serialized among
// themselves, in call order; every other operation uses another
// connection, so a stdin write the command does not read never delays a
// resize, signal, terminate or status. The owner must call Close.
type Client struct {
	dir  string
	sock string

	stdin conn // WriteStdin, CloseStdin
	ctl   conn // everything else

	closeOnce sync.Once
}

// conn is one lazily dialed connection.
type conn struct {
	// req serializes requests, and guards hdr and buf.
	req sync.Mutex
	hdr [proto.CtlHdrLen]byte
	buf []byte

	// mu guards c and closed; it is held only briefly, so Close never
	// waits for a request in flight (it closes the socket under it).
	mu     sync.Mutex
	c      *net.UnixConn
	closed bool
}

// Dial returns a Client for the session in dir. It fails with ErrNoSession
// when dir holds no started session; a session whose shim is gone still
// dials (its operations then answer from disk).
func Dial(ctx context.Context, dir string) (*Client, error) {
	sock, err := sessiondir.SocketPath(dir)
	if err != nil {
		return nil, fmt.Errorf("dial shim: %w", err)
	}
	c := &Client{dir: dir, sock: sock}
	if _, err := c.conn(ctx, &c.ctl); err != nil {
		if _, serr := sessiondir.ReadStatus(dir); serr != nil {
			return nil, fmt.Errorf("dial shim: %w", serr)
		}
	}
	return c, nil
}

// conn returns cn's connection, dialing it if needed.
func (c *Client) conn(ctx context.Context, cn *conn) (*net.UnixConn, error) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.closed {
		return nil, fmt.Errorf("shim client: %w", net.ErrClosed)
	}
	if cn.c != nil {
		return cn.c, nil
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.sock)
	if err != nil {
		return nil, err
	}
	cn.c = nc.(*net.UnixConn)
	return cn.c, nil
}

// drop closes nc and forgets it if it is still cn's connection.
func (cn *conn) drop(nc *net.UnixConn) {
	cn.mu.Lock()
	if cn.c == nc {
		cn.c = nil
	}
	cn.mu.Unlock()
	nc.Close()
}

// Close closes the Client's connections. It is idempotent; an operation
// in flight fails.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		for _, cn := range []*conn{&c.stdin, &c.ctl} {
			cn.mu.Lock()
			cn.closed = true
			if cn.c != nil {
				cn.c.Close()
				cn.c = nil
			}
			cn.mu.Unlock()
		}
	})
	return nil
}

// ErrFailed is returned when the shim answered that it failed doing what
// was asked (a kill or a resize the kernel refused): the command still
// runs, the request did not take effect, and repeating it unchanged will
// most likely fail again. runnerd answers it as wire.CodeProvider.
var ErrFailed = errors.New("shim failed")

// CodeOf returns the code of wire.ErrorTable that err from this package
// stands for, for a tool that reports shim errors in the shared
// vocabulary (runner-shim's exit statuses): command_exited, lost,
// invalid, write_failed, provider (ErrFailed), not_found (ErrNoSession),
// unavailable (ErrUnavailable, and a context that ended), else provider.
func CodeOf(err error) wire.Code {
	switch {
	case errors.Is(err, sessiondir.ErrExited):
		return wire.CodeCommandExited
	case errors.Is(err, sessiondir.ErrLost):
		return wire.CodeLost
	case errors.Is(err, sessiondir.ErrInvalid), errors.Is(err, sessiondir.ErrExists):
		return wire.CodeInvalid
	case errors.Is(err, sessiondir.ErrWriteFailed):
		return wire.CodeWriteFailed
	case errors.Is(err, ErrFailed):
		return wire.CodeProvider
	case errors.Is(err, sessiondir.ErrNoSession):
		return wire.CodeNotFound
	case errors.Is(err, sessiondir.ErrUnavailable), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return wire.CodeUnavailable
	}
	return wire.CodeProvider
}

// errGone means the shim could not be reached or dropped the connection;
// the caller then consults the session directory.
var errGone = errors.New("shim gone")

// call runs one request on cn. It returns errGone when the shim is not
// there (the caller decides from disk), ctx's error when ctx ended, and
// the response otherwise.
func (c *Client) call(ctx context.Context, cn *conn, op byte, body []byte) (byte, []byte, error) {
	cn.req.Lock()
	defer cn.req.Unlock()
	nc, err := c.conn(ctx, cn)
	if errors.Is(err, net.ErrClosed) {
		return 0, nil, err
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		return 0, nil, fmt.Errorf("%w: %v", errGone, err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	if cn.buf, err = proto.WriteMsg(nc, cn.buf, op, body); err == nil {
		var st byte
		var resp []byte
		st, resp, err = proto.ReadMsg(nc, &cn.hdr, cn.buf)
		if err == nil {
			if cap(resp) > 64<<10 {
				cn.buf = nil
			} else {
				cn.buf = resp
			}
			return st, resp, nil
		}
	}
	// The connection is in an unknown state: drop it; the next call redials.
	cn.drop(nc)
	cn.mu.Lock()
	closed := cn.closed
	cn.mu.Unlock()
	if closed {
		return 0, nil, fmt.Errorf("shim client: %w", net.ErrClosed)
	}
	if ctx.Err() != nil {
		return 0, nil, ctx.Err()
	}
	return 0, nil, fmt.Errorf("%w: %v", errGone, err)
}

// fromDisk turns an unreachable shim into the session's answer: ErrExited
// when the exit record exists, ErrLost when the shim is provably gone
// without one, ErrUnavailable (wrapping the cause) when it still seems to
// run.
func (c *Client) fromDisk(cause error) (sessiondir.Status, error) {
	st, err := sessiondir.ReadStatus(c.dir)
	if err != nil {
		return st, fmt.Errorf("%w: %v; %v", sessiondir.ErrUnavailable, cause, err)
	}
	switch {
	case st.State == sessiondir.StateLost, st.Exit != nil && st.Exit.Reason == wire.ExitLost:
		// A lost record (written by FinishLost, after an attach or
		// runnerd saw the shim gone) is still lost, never an exit.
		return st, sessiondir.ErrLost
	case st.State == sessiondir.StateExited:
		return st, sessiondir.ErrExited
	}
	return st, fmt.Errorf("%w: %v", sessiondir.ErrUnavailable, cause)
}

// answer maps a non-OK response to an error.
func answer(op string, st byte, body []byte) error {
	switch st {
	case proto.StOK:
		return nil
	case proto.StExited:
		if string(body) == proto.CodeClosed {
			return fmt.Errorf("%s: %w", op, sessiondir.ErrStdinClosed)
		}
		return fmt.Errorf("%s: %w", op, sessiondir.ErrExited)
	case proto.StError:
		var e proto.ErrBody
		json.Unmarshal(body, &e)
		switch e.Code {
		case proto.CodeInvalid:
			return fmt.Errorf("%s: %w: %s", op, sessiondir.ErrInvalid, e.Detail)
		case proto.CodeWriteFailed:
			return fmt.Errorf("%s: %w: %s", op, sessiondir.ErrWriteFailed, e.Detail)
		case proto.CodeProvider:
			return fmt.Errorf("%s: %w: %s", op, ErrFailed, e.Detail)
		case proto.CodeUnavailable:
			return fmt.Errorf("%s: %w: %s", op, sessiondir.ErrUnavailable, e.Detail)
		}
		return fmt.Errorf("%s: shim: %s: %s", op, e.Code, e.Detail)
	}
	return fmt.Errorf("%s: %w: status %d", op, proto.ErrProto, st)
}

// simple runs a request whose only answer is OK, exited, or an error.
func (c *Client) simple(ctx context.Context, cn *conn, name string, op byte, body []byte) error {
	st, resp, err := c.call(ctx, cn, op, body)
	if errors.Is(err, errGone) {
		_, err = c.fromDisk(err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return answer(name, st, resp)
}

// WriteStdin writes p to the command's stdin and returns once the shim
// wrote all of it to the pipe or terminal. Writes larger than
// MaxStdinChunk go in order as several requests. It returns ErrExited once
// the command has ended (ErrStdinClosed after CloseStdin, which also
// matches ErrExited), never a transport error for that case. When ctx ends
// during a write, the connection is closed and the shim stops the write
// where it stands: a prefix of p (none, some or all) has reached the
// command, the rest never will, and a later write follows that prefix
// (docs/frames.md, "A write stops when its caller goes").
func (c *Client) WriteStdin(ctx context.Context, p []byte) error {
	for {
		n := min(len(p), proto.MaxStdinChunk)
		if err := c.simple(ctx, &c.stdin, "write stdin", proto.OpWrite, p[:n]); err != nil {
			return err
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

// WriteStdinAt writes p to the command's stdin as the bytes that follow
// the first off stdin bytes of the session, and returns the shim's count
// of stdin bytes written once it is done. What the command already got
// (off behind the count: an earlier write of the same bytes that the
// caller could not confirm) is skipped, so sending the same bytes with
// the same offset again until one call succeeds delivers each exactly
// once. An off past the count is refused with ErrStdinGap, and nothing
// is written. Errors are WriteStdin's, and ErrNoStdinOffsets from a shim
// that predates offsets.
func (c *Client) WriteStdinAt(ctx context.Context, off int64, p []byte) (int64, error) {
	if off < 0 {
		return 0, fmt.Errorf("write stdin at %d: %w: negative offset", off, sessiondir.ErrInvalid)
	}
	for {
		n := min(len(p), proto.MaxStdinAtChunk)
		body := binary.BigEndian.AppendUint64(make([]byte, 0, 8+n), uint64(off))
		body = append(body, p[:n]...)
		count, err := c.stdinCall(ctx, "write stdin", proto.OpWriteAt, body)
		if err != nil {
			return 0, err
		}
		off += int64(n)
		p = p[n:]
		if len(p) == 0 {
			return count, nil
		}
	}
}

// StdinCount is the count of bytes the command's stdin has been given
// so far (by every write, acknowledged or cut short). ErrExited once the
// command has ended.
func (c *Client) StdinCount(ctx context.Context) (int64, error) {
	return c.stdinCall(ctx, "stdin count", proto.OpWrite, nil)
}

// stdinCall runs a write request whose OK answer is the stdin count.
func (c *Client) stdinCall(ctx context.Context, name string, op byte, body []byte) (int64, error) {
	st, resp, err := c.call(ctx, &c.stdin, op, body)
	if errors.Is(err, errGone) {
		_, err = c.fromDisk(err)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	if st == proto.StError {
		var e proto.ErrBody
		json.Unmarshal(resp, &e)
		switch {
		case e.Code == proto.CodeInvalid && strings.HasPrefix(e.Detail, "stdin offset"):
			return 0, fmt.Errorf("%s: %w: %s", name, sessiondir.ErrStdinGap, e.Detail)
		case e.Code == proto.CodeInvalid && strings.HasPrefix(e.Detail, "unknown op"):
			return 0, fmt.Errorf("%s: %w", name, sessiondir.ErrNoStdinOffsets)
		}
	}
	if err := answer(name, st, resp); err != nil {
		return 0, err
	}
	if len(resp) != 8 {
		// An older shim answers a write with no body.
		return 0, fmt.Errorf("%s: %w", name, sessiondir.ErrNoStdinOffsets)
	}
	return int64(binary.BigEndian.Uint64(resp)), nil
}

// CloseStdin delivers a real end of file to the command, once; a repeat is
// a no-op. Pipes: the shim closes the stdin pipe. TTY: the shim writes the
// terminal's VEOF character (^D) at the start of a line (see
// docs/frames.md). It returns ErrExited after the command ended.
func (c *Client) CloseStdin(ctx context.Context) error {
	return c.simple(ctx, &c.stdin, "close stdin", proto.OpCloseStdin, nil)
}

// Resize sets the terminal size of a TTY session (the command gets
// SIGWINCH). ErrInvalid for a pipes session or a zero size; ErrExited
// after the exit.
func (c *Client) Resize(ctx context.Context, rows, cols uint16) error {
	var b [4]byte
	binary.BigEndian.PutUint16(b[:], rows)
	binary.BigEndian.PutUint16(b[2:], cols)
	return c.simple(ctx, &c.ctl, "resize", proto.OpResize, b[:])
}

// Signal sends sig to the command's process group. ErrExited after the
// exit.
func (c *Client) Signal(ctx context.Context, sig syscall.Signal) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(sig))
	return c.simple(ctx, &c.ctl, "signal", proto.OpSignal, b[:])
}

// Terminate stops every process the session started: SIGTERM to the
// command's process group and to the group of every other process below
// the shim, SIGKILL after grace to every one still alive. It returns the
// exit record once it is in the journal and nothing is left (see
// docs/frames.md). A session that already ended has its lingering
// descendants (Status.Descendants) stopped the same way and answers its
// unchanged record; with none, at once. ErrLost when the shim is
// gone without a record; ErrUnavailable when the shim cannot be reached
// and the session may still run (the end is uncertain: retry).
func (c *Client) Terminate(ctx context.Context, grace time.Duration) (journal.Exit, error) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(max(grace, 0)/time.Millisecond))
	st, resp, err := c.call(ctx, &c.ctl, proto.OpTerminate, b[:])
	if errors.Is(err, errGone) {
		ds, derr := c.fromDisk(err)
		if errors.Is(derr, sessiondir.ErrExited) && ds.Exit != nil {
			return *ds.Exit, nil
		}
		err = derr
	}
	if err != nil {
		return journal.Exit{}, fmt.Errorf("terminate: %w", err)
	}
	if err := answer("terminate", st, resp); err != nil {
		return journal.Exit{}, err
	}
	var e journal.Exit
	if err := json.Unmarshal(resp, &e); err != nil {
		return journal.Exit{}, fmt.Errorf("terminate: decode exit record: %w", err)
	}
	return e, nil
}

// Status asks the shim for the session's status, or reads it from disk
// when the shim is gone.
func (c *Client) Status(ctx context.Context) (sessiondir.Status, error) {
	st, resp, err := c.call(ctx, &c.ctl, proto.OpStatus, nil)
	if errors.Is(err, errGone) {
		ds, derr := c.fromDisk(err)
		if errors.Is(derr, sessiondir.ErrExited) || errors.Is(derr, sessiondir.ErrLost) {
			return ds, nil
		}
		err = derr
	}
	if err != nil {
		return sessiondir.Status{}, fmt.Errorf("status: %w", err)
	}
	if err := answer("status", st, resp); err != nil {
		return sessiondir.Status{}, err
	}
	var s sessiondir.Status
	if err := json.Unmarshal(resp, &s); err != nil {
		return sessiondir.Status{}, fmt.Errorf("status: decode: %w", err)
	}
	return s, nil
}

// OffsetAt returns the offset of stream at time t (the first byte written
// at or after t, to the journal's mark granularity), from the shim while it
// runs and from the journal's index after.
func (c *Client) OffsetAt(ctx context.Context, stream string, t time.Time) (int64, error) {
	body, _ := json.Marshal(proto.OffsetReq{Stream: stream, Time: t.Format(time.RFC3339Nano)})
	st, resp, err := c.call(ctx, &c.ctl, proto.OpOffsetAt, body)
	if errors.Is(err, errGone) {
		if _, derr := c.fromDisk(err); errors.Is(derr, sessiondir.ErrExited) || errors.Is(derr, sessiondir.ErrLost) {
			off, oerr := sessiondir.OffsetFromDisk(c.dir, stream, t)
			if oerr != nil {
				return 0, fmt.Errorf("offset at: %w", oerr)
			}
			return off, nil
		} else {
			err = derr
		}
	}
	if err != nil {
		return 0, fmt.Errorf("offset at: %w", err)
	}
	if err := answer("offset at", st, resp); err != nil {
		return 0, err
	}
	if len(resp) != 8 {
		return 0, fmt.Errorf("offset at: %w: %d-byte answer", proto.ErrProto, len(resp))
	}
	return int64(binary.BigEndian.Uint64(resp)), nil
}

// Marks returns stream's offset-time marks from the one covering byte from
// (wire.Marks), from the shim while it runs and from the journal's index
// after.
func (c *Client) Marks(ctx context.Context, stream string, from int64) (wire.Marks, error) {
	body, _ := json.Marshal(proto.MarksReq{Stream: stream, From: from})
	st, resp, err := c.call(ctx, &c.ctl, proto.OpMarks, body)
	if errors.Is(err, errGone) {
		if _, derr := c.fromDisk(err); errors.Is(derr, sessiondir.ErrExited) || errors.Is(derr, sessiondir.ErrLost) {
			m, merr := sessiondir.MarksFromDisk(c.dir, stream, from)
			if merr != nil {
				return wire.Marks{}, fmt.Errorf("marks: %w", merr)
			}
			return m, nil
		} else {
			err = derr
		}
	}
	if err != nil {
		return wire.Marks{}, fmt.Errorf("marks: %w", err)
	}
	if err := answer("marks", st, resp); err != nil {
		return wire.Marks{}, err
	}
	var m wire.Marks
	if err := json.Unmarshal(resp, &m); err != nil {
		return wire.Marks{}, fmt.Errorf("marks: %w: %v", proto.ErrProto, err)
	}
	return m, nil
}

// Inspect returns the Info of the session in dir: its status from the
// live shim when it answers (which knows its descendants), else from disk.
// It returns ErrNoSession when dir holds no started session.
func Inspect(ctx context.Context, dir string) (sessiondir.Info, error) {
	c, err := Dial(ctx, dir)
	if err != nil {
		return sessiondir.Info{}, err
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return sessiondir.Info{}, err
	}
	return sessiondir.Describe(dir, st)
}

// CopyStdin writes everything read from r to the session's stdin, in
// chunks as they arrive, and returns at r's EOF (without closing the
// command's stdin).
func CopyStdin(ctx context.Context, c *Client, r io.Reader) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := c.WriteStdin(ctx, buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
	}
}

// CopyStdinBase64 writes to the session's stdin the bytes of each base64
// line read from r (blank lines are skipped), one write per line, and
// returns at r's EOF. A line that does not decode is ErrInvalid, after the
// lines before it were written.
func CopyStdinBase64(ctx context.Context, c *Client, r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		p, err := base64.StdEncoding.AppendDecode(nil, line)
		if err != nil {
			return fmt.Errorf("%w: decode stdin line: %v", sessiondir.ErrInvalid, err)
		}
		if err := c.WriteStdin(ctx, p); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	return nil
}
