package e2b

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The Connect protocol's streaming envelope (connectrpc.com/docs/protocol,
// "Streaming-Request" / "Streaming-Response"): one flags byte, a big-endian
// uint32 length, then the message. Flag 0x01 marks a compressed message,
// 0x02 the end-stream message, a JSON object with the stream's error and
// trailers. Written here from the protocol text; no Connect library.
const (
	flagCompressed = 0x01
	flagEndStream  = 0x02

	envelopeHeaderLen = 5

	// MaxMessageSize bounds one enveloped message either way. envd sends
	// output in chunks of at most 32 KiB (base64 in JSON: about 44 KiB);
	// anything near this bound is a broken peer.
	MaxMessageSize = 4 << 20
)

// Content types of the Connect protocol with the JSON codec.
const (
	contentTypeUnary  = "application/json"
	contentTypeStream = "application/connect+json"
)

// errFrame marks a malformed envelope; it is mapped to a provider error
// (the peer broke the protocol), or unavailable when the body was cut.
var errFrame = errors.New("malformed connect envelope")

// appendEnvelope appends one enveloped message to dst.
func appendEnvelope(dst []byte, flags byte, msg []byte) []byte {
	var h [envelopeHeaderLen]byte
	h[0] = flags
	binary.BigEndian.PutUint32(h[1:], uint32(len(msg)))
	return append(append(dst, h[:]...), msg...)
}

// writeEnvelope writes one enveloped message in a single Write, so
// concurrent writers to distinct streams never interleave halves.
func writeEnvelope(w io.Writer, flags byte, msg []byte) error {
	if len(msg) > MaxMessageSize {
		return fmt.Errorf("write envelope of %d bytes: %w", len(msg), errFrame)
	}
	_, err := w.Write(appendEnvelope(make([]byte, 0, envelopeHeaderLen+len(msg)), flags, msg))
	return err
}

// readEnvelope reads one enveloped message. It returns io.EOF only at a
// clean boundary before any byte of a header; a body that ends inside an
// envelope is io.ErrUnexpectedEOF.
func readEnvelope(r io.Reader) (flags byte, msg []byte, err error) {
	var h [envelopeHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	flags = h[0]
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxMessageSize {
		return 0, nil, fmt.Errorf("envelope of %d bytes exceeds %d: %w", n, MaxMessageSize, errFrame)
	}
	if flags&flagCompressed != 0 {
		// We never offer Connect-Content-Encoding, so a compressed message
		// is a protocol violation.
		return 0, nil, fmt.Errorf("compressed envelope was not negotiated: %w", errFrame)
	}
	if flags&^(flagCompressed|flagEndStream) != 0 {
		return 0, nil, fmt.Errorf("unknown envelope flags %#x: %w", flags, errFrame)
	}
	msg = make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return flags, msg, nil
}

// wireError is a Connect error as JSON: the body of a failed unary call and
// the "error" member of an end-stream message.
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// endStream is the end-stream message.
type endStream struct {
	Error    *wireError          `json:"error,omitempty"`
	Metadata map[string][]string `json:"metadata,omitempty"`
}

// parseEndStream decodes an end-stream message.
func parseEndStream(msg []byte) (endStream, error) {
	var es endStream
	if err := json.Unmarshal(msg, &es); err != nil {
		return endStream{}, fmt.Errorf("decode end-stream message: %w", errFrame)
	}
	if es.Error != nil && es.Error.Code == "" {
		return endStream{}, fmt.Errorf("end-stream error without a code: %w", errFrame)
	}
	return es, nil
}
