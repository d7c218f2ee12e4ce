// Package proto is what the two ends of a shim say to each other: the
// control socket's messages (client in shim/launch, server in shim), the
// readiness line's start phases and their classification, and the modes
// the launcher starts the supervisor in. Internal: its wire form is
// shared only by the shim packages of one build, and by a running shim
// of an older build through the control socket, which therefore never
// changes incompatibly.
package proto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"syscall"

	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// The control socket protocol (docs/frames.md, "Control socket"). A
// connection carries a sequence of request/response pairs; the client sends
// one request and reads its response before the next. Both directions use
// the same 8-byte header followed by a body:
//
//	0  1  magic   0xD6
//	1  1  version 1
//	2  1  op (request) or status (response)
//	3  1  reserved, 0
//	4  4  body length, big-endian uint32, at most maxBody
const (
	ctlMagic   = 0xD6
	ctlVersion = 1
	CtlHdrLen  = 8
	maxBody    = 1 << 20 // largest request or response body
	// MaxStdinChunk is the largest stdin payload of one request; the
	// client splits larger writes into chunks of this size, in order.
	MaxStdinChunk = maxBody
	// maxStdinAtChunk is the largest stdin payload of one opWriteAt
	// request: its body also holds the 8-byte offset.
	MaxStdinAtChunk = maxBody - 8
)

// Request ops.
const (
	OpWrite      = 1 // body: raw stdin bytes (0..MaxStdinChunk); answer: count uint64
	OpCloseStdin = 2 // body: empty
	OpResize     = 3 // body: rows uint16, cols uint16 (big-endian)
	OpSignal     = 4 // body: signal number uint32
	OpTerminate  = 5 // body: grace in milliseconds uint64
	OpStatus     = 6 // body: empty
	OpOffsetAt   = 7 // body: JSON {"stream":"stdout","time":"RFC 3339"}
	OpMarks      = 8 // body: JSON {"stream":"stdout","from":N}; answer: JSON wire.Marks
	// opWriteAt is opWrite with the caller's idea of where its bytes go:
	// body: offset uint64 (the stdin bytes that precede these), then raw
	// stdin bytes (0..maxStdinAtChunk); answer: count uint64. What the
	// command already got is skipped, a gap is refused (writeStdinAt).
	OpWriteAt = 9
)

// Response statuses.
const (
	StOK     = 0 // body: op-specific (terminate: exit JSON; status: Status JSON; offset_at: int64; write, write_at: the stdin count uint64)
	StExited = 1 // the command has ended (or stdin was closed); body: empty or a reason
	StError  = 2 // body: JSON {"code": "...", "detail": "..."}
)

// Error codes of an stError body: codes of wire.ErrorTable, so the shim,
// runnerd and every client share one vocabulary. Client.answer decodes
// each into a sentinel of this package.
const (
	CodeInvalid     = wire.CodeInvalid
	CodeWriteFailed = wire.CodeWriteFailed
	// codeProvider: the shim failed doing what was asked (a kill or a
	// resize the kernel refused, a stdin write that failed for a reason
	// other than the command's end). Decoded as ErrFailed.
	CodeProvider = wire.CodeProvider
	// codeUnavailable: a stdin write stopped because its caller went
	// away (writeStdin); the body says how much of it was delivered.
	CodeUnavailable = wire.CodeUnavailable
)

// CodeClosed is the body of an stExited answer to a write after
// CloseStdin; it is not an error code.
const CodeClosed = "stdin_closed"

type OffsetReq struct {
	Stream string `json:"stream"`
	Time   string `json:"time"`
}

type MarksReq struct {
	Stream string `json:"stream"`
	From   int64  `json:"from"`
}

type ErrBody struct {
	Code   wire.Code `json:"code"`
	Detail string    `json:"detail,omitempty"`
}

// ErrProto is returned for bytes on the control socket that break the
// protocol.
var ErrProto = errors.New("control protocol violation")

func putCtlHeader(h []byte, op byte, n int) {
	h[0], h[1], h[2], h[3] = ctlMagic, ctlVersion, op, 0
	binary.BigEndian.PutUint32(h[4:], uint32(n))
}

// WriteMsg writes one header+body with a single write call.
func WriteMsg(w io.Writer, buf []byte, op byte, body []byte) ([]byte, error) {
	if len(body) > maxBody {
		return buf, fmt.Errorf("write control message: body of %d bytes: %w", len(body), ErrProto)
	}
	buf = append(buf[:0], make([]byte, CtlHdrLen)...)
	putCtlHeader(buf, op, len(body))
	buf = append(buf, body...)
	_, err := w.Write(buf)
	return buf, err
}

// ReadMsg reads one message; body reuses buf. A clean EOF before the header
// is io.EOF, a cut inside is io.ErrUnexpectedEOF.
func ReadMsg(r io.Reader, hdr *[CtlHdrLen]byte, buf []byte) (op byte, body []byte, err error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	if hdr[0] != ctlMagic || hdr[1] != ctlVersion {
		return 0, nil, fmt.Errorf("read control message: bad magic or version %x: %w", hdr[:2], ErrProto)
	}
	n := binary.BigEndian.Uint32(hdr[4:])
	if n > maxBody {
		return 0, nil, fmt.Errorf("read control message: body of %d bytes: %w", n, ErrProto)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[2], buf, nil
}

func ErrorBody(code wire.Code, detail string) []byte {
	b, _ := json.Marshal(ErrBody{Code: code, Detail: detail})
	return b
}

// The phases of a start failure (StartError.Phase).
const (
	// PhaseExec is a failure of the caller's command itself: its
	// executable (PATH lookup, execve), its working directory, or its
	// run-as user's lookup. Retrying the same request fails the same way.
	PhaseExec = "exec"
	// PhaseSetup is any other failure: the shim's own start, its
	// journal, control socket, network namespace, a fork that the host
	// refused (EAGAIN, ENOMEM). It says nothing about the request.
	PhaseSetup = "setup"
)

// CommandError marks a start failure of the caller's command (see
// PhaseExec); the shim reports it with that phase.
type CommandError struct{ Err error }

func (e *CommandError) Error() string { return e.Err.Error() }
func (e *CommandError) Unwrap() error { return e.Err }

// commandErrnos are the errnos of a fork/exec of the command that are its
// own (a missing or unrunnable executable or working directory), as
// opposed to the host's (EAGAIN, ENOMEM, EMFILE, ETXTBSY, EPERM of a
// setuid).
var commandErrnos = []syscall.Errno{syscall.ENOENT, syscall.EACCES, syscall.ENOEXEC, syscall.ENOTDIR,
	syscall.EISDIR, syscall.ELOOP, syscall.ENAMETOOLONG, syscall.E2BIG, syscall.ELIBBAD}

// AsCommandError marks err as the command's when it is a fork/exec of the
// command that failed with one of commandErrnos.
func AsCommandError(err error) error {
	var pe *os.PathError
	var en syscall.Errno
	if errors.As(err, &pe) && pe.Op == "fork/exec" && errors.As(err, &en) && slices.Contains(commandErrnos, en) {
		return &CommandError{err}
	}
	return err
}

// PhaseOf is the readiness line's PHASE for a start failure.
func PhaseOf(err error) string {
	var ce *CommandError
	if errors.As(err, &ce) {
		return PhaseExec
	}
	return PhaseSetup
}

// SocketPair makes a connected pair of stream sockets, both close-on-exec:
// ours, with deadlines and CloseWrite, and the child's end, to pass in
// ExtraFiles (and close once the child has it).
func SocketPair(name string) (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	child := os.NewFile(uintptr(fds[1]), name+"-child")
	pf := os.NewFile(uintptr(fds[0]), name)
	c, err := net.FileConn(pf) // dups: pf is ours to close
	pf.Close()
	if err != nil {
		child.Close()
		return nil, nil, err
	}
	return c.(*net.UnixConn), child, nil
}

// UnwrapPath returns the errno inside a *PathError, so the helper's report
// keeps it.
func UnwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// The supervisor's modes the launcher starts (the first argument after
// the program's own prefix; shim.Main's table).
const (
	// ModeSession is a cold start: [--detach] [--ready-fd N] DIR.
	ModeSession = "session"
	// ModeWarm is a warm shim: [--detach] --warm-fd N --warm-root ROOT
	// [--warm-retain BYTES] [--warm-nsexec].
	ModeWarm = "warm"
)
