package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The binary frame stream (docs/frames.md). Every frame is a fixed 16-byte
// header followed by its payload:
//
//	offset size field
//	0      1    magic   0xD5
//	1      1    version 1
//	2      1    kind    1 data, 2 heartbeat, 3 exit, 4 lost, 5 error
//	3      1    stream  1 stdout, 2 stderr (data frames); 0 otherwise
//	4      8    offset  big-endian uint64: stream offset of the first payload byte (data); 0 otherwise
//	12     4    length  big-endian uint32: payload bytes, at most MaxFramePayload
//
// The stream is self-delimiting, so a reader that is cut anywhere (inside a
// header or a payload) gets io.ErrUnexpectedEOF and never a partial frame.
// Exactly one terminal frame (exit, lost or error) ends a well-formed stream.

// Frame layout constants.
const (
	FrameMagic      = 0xD5    // first byte of every frame
	FrameVersion    = 1       // second byte of every frame
	FrameHeaderLen  = 16      // bytes of the fixed header
	MaxFramePayload = 1 << 20 // largest payload a frame may carry
)

// FrameKind is the kind byte of a frame.
type FrameKind uint8

// Frame kinds.
const (
	// FrameData carries output bytes of one stream at an offset.
	FrameData FrameKind = 1
	// FrameHeartbeat carries nothing; it is sent on long silences so a
	// reader can tell a quiet session from a dead transport.
	FrameHeartbeat FrameKind = 2
	// FrameExit is terminal: the payload is the exit record (JSON [Exit]).
	FrameExit FrameKind = 3
	// FrameLost is terminal: the session's supervisor died without an exit
	// record. The payload is empty or a JSON [Exit] with reason "lost" whose
	// Lengths are the final lengths that were readable. Never an exit code.
	FrameLost FrameKind = 4
	// FrameError is terminal: the stream could not continue. The payload is
	// a JSON [Error] (code from the taxonomy, e.g. truncated, invalid,
	// unavailable).
	FrameError FrameKind = 5
)

// Terminal reports whether a frame of kind k ends the stream.
func (k FrameKind) Terminal() bool { return k == FrameExit || k == FrameLost || k == FrameError }

func (k FrameKind) String() string {
	switch k {
	case FrameData:
		return "data"
	case FrameHeartbeat:
		return "heartbeat"
	case FrameExit:
		return "exit"
	case FrameLost:
		return "lost"
	case FrameError:
		return "error"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// StreamID is the stream byte of a data frame.
type StreamID uint8

// Stream ids.
const (
	StreamStdout StreamID = 1
	StreamStderr StreamID = 2
)

// StreamName returns "stdout" or "stderr", or "" for an unknown id.
func (s StreamID) StreamName() string {
	switch s {
	case StreamStdout:
		return "stdout"
	case StreamStderr:
		return "stderr"
	}
	return ""
}

// StreamByName returns the id of "stdout" or "stderr", and false otherwise.
func StreamByName(name string) (StreamID, bool) {
	switch name {
	case "stdout":
		return StreamStdout, true
	case "stderr":
		return StreamStderr, true
	}
	return 0, false
}

var (
	// ErrBadMagic is returned when a frame does not start with FrameMagic
	// (the byte stream is not a frame stream, or it lost sync).
	ErrBadMagic = errors.New("frame: bad magic")
	// ErrBadVersion is returned when a frame's version byte is not
	// FrameVersion.
	ErrBadVersion = errors.New("frame: unsupported version")
	// ErrFrameTooLarge is returned when a frame's payload length exceeds
	// MaxFramePayload, by the decoder and by the encoders.
	ErrFrameTooLarge = errors.New("frame: payload too large")
	// ErrBadFrame is returned for a header that is well-formed but
	// inconsistent: an unknown kind, a data frame without a valid stream or
	// with an empty payload, a non-data frame with a stream or offset, a
	// heartbeat with a payload, or an offset beyond 2^63-1.
	ErrBadFrame = errors.New("frame: malformed frame")
)

// Frame is one decoded frame. For a frame returned by [Decoder.Next],
// Payload aliases the decoder's buffer and is valid only until the next
// call.
type Frame struct {
	Kind    FrameKind
	Stream  StreamID // data frames only
	Offset  int64    // data frames only: offset of Payload[0] in the stream
	Payload []byte
}

// End returns the offset just past the frame's payload (data frames).
func (f Frame) End() int64 { return f.Offset + int64(len(f.Payload)) }

// Exit decodes the payload of an exit or lost frame. An empty lost payload
// yields an Exit with reason "lost" and nothing else.
func (f Frame) Exit() (Exit, error) {
	var e Exit
	switch f.Kind {
	case FrameExit:
	case FrameLost:
		if len(f.Payload) == 0 {
			return Exit{Reason: ExitLost}, nil
		}
	default:
		return e, fmt.Errorf("decode exit of %s frame: %w", f.Kind, ErrBadFrame)
	}
	if err := json.Unmarshal(f.Payload, &e); err != nil {
		return e, fmt.Errorf("decode exit record: %w", err)
	}
	return e, nil
}

// Err decodes the payload of an error frame.
func (f Frame) Err() (*Error, error) {
	if f.Kind != FrameError {
		return nil, fmt.Errorf("decode error of %s frame: %w", f.Kind, ErrBadFrame)
	}
	e := new(Error)
	if err := json.Unmarshal(f.Payload, e); err != nil {
		return nil, fmt.Errorf("decode error body: %w", err)
	}
	return e, nil
}

func putHeader(h []byte, k FrameKind, s StreamID, off int64, n int) {
	h[0] = FrameMagic
	h[1] = FrameVersion
	h[2] = byte(k)
	h[3] = byte(s)
	binary.BigEndian.PutUint64(h[4:12], uint64(off))
	binary.BigEndian.PutUint32(h[12:16], uint32(n))
}

func appendFrame(dst []byte, k FrameKind, s StreamID, off int64, p []byte) []byte {
	var h [FrameHeaderLen]byte
	putHeader(h[:], k, s, off, len(p))
	return append(append(dst, h[:]...), p...)
}

// AppendData appends a data frame for stream s carrying p, whose first byte
// is at offset off of the stream, to dst and returns the extended buffer. It
// does not allocate when dst has room for FrameHeaderLen+len(p) more bytes.
// An empty p, a negative offset or an unknown stream is ErrBadFrame; a p
// longer than MaxFramePayload is ErrFrameTooLarge (split it).
func AppendData(dst []byte, s StreamID, off int64, p []byte) ([]byte, error) {
	if s != StreamStdout && s != StreamStderr || off < 0 || len(p) == 0 {
		return dst, fmt.Errorf("append data frame: %w", ErrBadFrame)
	}
	if len(p) > MaxFramePayload {
		return dst, fmt.Errorf("append data frame of %d bytes: %w", len(p), ErrFrameTooLarge)
	}
	return appendFrame(dst, FrameData, s, off, p), nil
}

// AppendHeartbeat appends a heartbeat frame to dst.
func AppendHeartbeat(dst []byte) []byte {
	return appendFrame(dst, FrameHeartbeat, 0, 0, nil)
}

// AppendExit appends the terminal exit frame carrying e to dst.
func AppendExit(dst []byte, e Exit) ([]byte, error) {
	return appendJSON(dst, FrameExit, e)
}

// AppendLost appends the terminal lost frame to dst. e may carry the final
// readable lengths and a detail; its Reason is forced to "lost".
func AppendLost(dst []byte, e Exit) ([]byte, error) {
	e.Reason = ExitLost
	return appendJSON(dst, FrameLost, e)
}

// AppendError appends the terminal error frame carrying e to dst.
func AppendError(dst []byte, e Error) ([]byte, error) {
	return appendJSON(dst, FrameError, e)
}

func appendJSON(dst []byte, k FrameKind, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, fmt.Errorf("encode %s frame: %w", k, err)
	}
	if len(b) > MaxFramePayload {
		return dst, fmt.Errorf("encode %s frame: %w", k, ErrFrameTooLarge)
	}
	return appendFrame(dst, k, 0, 0, b), nil
}

// AppendFrame appends f to dst after checking it as the decoder would.
func AppendFrame(dst []byte, f Frame) ([]byte, error) {
	if err := checkHeader(f.Kind, f.Stream, uint64(f.Offset), len(f.Payload)); err != nil {
		return dst, fmt.Errorf("append %s frame: %w", f.Kind, err)
	}
	return appendFrame(dst, f.Kind, f.Stream, f.Offset, f.Payload), nil
}

func checkHeader(k FrameKind, s StreamID, off uint64, n int) error {
	if n > MaxFramePayload {
		return ErrFrameTooLarge
	}
	switch k {
	case FrameData:
		if s != StreamStdout && s != StreamStderr || off > 1<<63-1 || n == 0 {
			return ErrBadFrame
		}
	case FrameHeartbeat:
		if s != 0 || off != 0 || n != 0 {
			return ErrBadFrame
		}
	case FrameExit, FrameLost, FrameError:
		if s != 0 || off != 0 {
			return ErrBadFrame
		}
	default:
		return ErrBadFrame
	}
	return nil
}

// PayloadLen is the payload length the frame header h (at least
// FrameHeaderLen bytes) announces, unchecked: for a reader that sizes its
// buffer before ParseFrame validates the whole frame.
func PayloadLen(h []byte) int { return int(binary.BigEndian.Uint32(h[12:16])) }

func parseHeader(h []byte) (Frame, int, error) {
	if h[0] != FrameMagic {
		return Frame{}, 0, fmt.Errorf("decode frame header: %w (0x%02x)", ErrBadMagic, h[0])
	}
	if h[1] != FrameVersion {
		return Frame{}, 0, fmt.Errorf("decode frame header: %w (%d)", ErrBadVersion, h[1])
	}
	k, s := FrameKind(h[2]), StreamID(h[3])
	off := binary.BigEndian.Uint64(h[4:12])
	n := PayloadLen(h)
	if n > MaxFramePayload {
		return Frame{}, 0, fmt.Errorf("decode frame header: %w (%d bytes)", ErrFrameTooLarge, n)
	}
	if err := checkHeader(k, s, off, n); err != nil {
		return Frame{}, 0, fmt.Errorf("decode %s frame header: %w", k, err)
	}
	return Frame{Kind: k, Stream: s, Offset: int64(off)}, n, nil
}

// ParseFrame decodes exactly one frame from b, for transports that carry
// one frame per message (a WebSocket binary message). A b shorter than the
// frame is io.ErrUnexpectedEOF; bytes after the frame are ErrBadFrame.
// Payload aliases b.
func ParseFrame(b []byte) (Frame, error) {
	if len(b) < FrameHeaderLen {
		return Frame{}, io.ErrUnexpectedEOF
	}
	f, n, err := parseHeader(b[:FrameHeaderLen])
	if err != nil {
		return Frame{}, err
	}
	switch rest := len(b) - FrameHeaderLen; {
	case rest < n:
		return Frame{}, io.ErrUnexpectedEOF
	case rest > n:
		return Frame{}, fmt.Errorf("decode frame: %d trailing bytes: %w", rest-n, ErrBadFrame)
	}
	f.Payload = b[FrameHeaderLen:]
	return f, nil
}

// Decoder reads frames from a byte stream. It is not safe for concurrent
// use. It buffers at most one frame (header plus MaxFramePayload).
type Decoder struct {
	r   io.Reader
	hdr [FrameHeaderLen]byte
	buf []byte
	err error // sticky: once the stream is broken, every Next returns it
}

// NewDecoder returns a Decoder reading from r. Wrap r in a bufio.Reader if
// it is unbuffered and frames are small.
func NewDecoder(r io.Reader) *Decoder { return &Decoder{r: r} }

// Next returns the next frame. It returns io.EOF when the stream ends
// cleanly between frames, io.ErrUnexpectedEOF when it ends inside a frame,
// and ErrBadMagic, ErrBadVersion, ErrFrameTooLarge or ErrBadFrame (wrapped)
// for bytes that are not a valid frame; every error is sticky. The returned
// Payload is valid until the next call. Next does not enforce that a
// terminal frame is last; a reader should stop at the first terminal frame.
func (d *Decoder) Next() (Frame, error) {
	if d.err != nil {
		return Frame{}, d.err
	}
	f, err := d.next()
	if err != nil {
		d.err = err
	}
	return f, err
}

func (d *Decoder) next() (Frame, error) {
	if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
		return Frame{}, err // io.EOF before the first byte, io.ErrUnexpectedEOF after
	}
	f, n, err := parseHeader(d.hdr[:])
	if err != nil {
		return Frame{}, err
	}
	if cap(d.buf) < n {
		d.buf = make([]byte, n, max(n, min(2*cap(d.buf), MaxFramePayload)))
	}
	d.buf = d.buf[:n]
	if _, err := io.ReadFull(d.r, d.buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	f.Payload = d.buf
	return f, nil
}
