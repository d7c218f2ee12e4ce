package seccomp

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// A compiled program travels as bytes, so that it is compiled once (by
// the process that starts isolated commands, ahead of their starts) and
// installed by each start's helper without compiling: resolving and
// compiling Docker's profile is about 0.3 ms of CPU and ~1 MiB of
// garbage, which a start should not pay.
//
// The encoding, version 1 (all integers little endian):
//
//	magic    4 bytes  "RSBF"
//	version  2 bytes  1
//	reserved 2 bytes  0
//	arch     4 bytes  AUDIT_ARCH_* the program was compiled for
//	count    4 bytes  number of instructions, 1 to BPF_MAXINSNS
//	insns    count × 8 bytes: struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}
//	sum      32 bytes SHA-256 of everything before it
//
// The instructions are the kernel's raw sock_filter array (on the
// little-endian architectures this package supports, byte for byte what
// SECCOMP_SET_MODE_FILTER reads). [Decode] refuses anything but an intact
// program of this version for this architecture ([ErrCorrupt]), so a
// truncated or altered program is never installed: a start that cannot
// have its filter fails, it never runs unfiltered or under a weaker one.

// ErrCorrupt is returned by [Decode] when the bytes are not an intact
// program of this encoding's version for the running architecture: a
// wrong magic, version or architecture, a length that does not match the
// instruction count, or a checksum that does not match.
var ErrCorrupt = errors.New("seccomp: program not intact")

const (
	programMagic   = "RSBF"
	programVersion = 1
	headerLen      = 16
	insnLen        = 8
	sumLen         = sha256.Size
)

// MarshalBinary encodes f's program (see [Decode] for the encoding). The
// bytes are the same for the same program: two compiles of the same
// profile on the same kernel encode identically.
func (f *Filter) MarshalBinary() ([]byte, error) {
	info, ok := nativeArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedArch, runtime.GOARCH)
	}
	b := make([]byte, 0, headerLen+insnLen*len(f.raw)+sumLen)
	b = append(b, programMagic...)
	b = binary.LittleEndian.AppendUint16(b, programVersion)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(info.ID))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(f.raw)))
	for _, in := range f.raw {
		b = binary.LittleEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.LittleEndian.AppendUint32(b, in.K)
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...), nil
}

// Decode returns the filter b encodes ([Filter.MarshalBinary]), ready to
// [Filter.Load], without compiling anything. It returns an error wrapping
// [ErrCorrupt] unless b is exactly one intact program of this version for
// the running architecture, and [ErrUnsupportedArch] on an architecture
// the package does not handle.
func Decode(b []byte) (*Filter, error) {
	info, ok := nativeArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedArch, runtime.GOARCH)
	}
	if len(b) < headerLen+insnLen+sumLen {
		return nil, fmt.Errorf("%w: %d bytes, too short for one instruction", ErrCorrupt, len(b))
	}
	body, sum := b[:len(b)-sumLen], b[len(b)-sumLen:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if string(body[:4]) != programMagic {
		return nil, fmt.Errorf("%w: magic %q", ErrCorrupt, body[:4])
	}
	if v := binary.LittleEndian.Uint16(body[4:]); v != programVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrCorrupt, v, programVersion)
	}
	if a := binary.LittleEndian.Uint32(body[8:]); a != uint32(info.ID) {
		return nil, fmt.Errorf("%w: compiled for architecture %#x, running on %#x", ErrCorrupt, a, uint32(info.ID))
	}
	n := binary.LittleEndian.Uint32(body[12:])
	if n == 0 || n > bpfMaxInsns || uint64(len(body)) != headerLen+insnLen*uint64(n) {
		return nil, fmt.Errorf("%w: %d instructions in %d bytes", ErrCorrupt, n, len(body)-headerLen)
	}
	// Only the raw program: the kernel takes it as it is (f.insts, the
	// compiler's form, stays empty; nothing but the tests reads it).
	f := &Filter{raw: make([]unix.SockFilter, n)}
	for i := range f.raw {
		in := body[headerLen+insnLen*i:]
		f.raw[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.LittleEndian.Uint32(in[4:])}
	}
	return f, nil
}
