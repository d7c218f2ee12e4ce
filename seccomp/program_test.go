package seccomp

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

func mustEncode(t *testing.T, f *Filter) []byte {
	t.Helper()
	b, err := f.MarshalBinary()
	if err != nil {
		t.Fatalf("MarshalBinary: %v", err)
	}
	return b
}

// TestProgramIdenticalToFreshCompile: the precompiled program a start
// installs is, byte for byte, what compiling the profile at that start
// would have installed; two compiles encode identically.
func TestProgramIdenticalToFreshCompile(t *testing.T) {
	a := mustEncode(t, mustDefault(t))
	b := mustEncode(t, mustDefault(t))
	if !bytes.Equal(a, b) {
		t.Fatalf("two compiles encode differently (%d and %d bytes)", len(a), len(b))
	}
	fresh := mustDefault(t)
	got, err := Decode(a)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !slices.Equal(got.raw, fresh.raw) {
		t.Fatalf("decoded program differs from a fresh compile (%d and %d instructions)", len(got.raw), len(fresh.raw))
	}
	if want := headerLen + insnLen*fresh.Len() + sumLen; len(a) != want {
		t.Fatalf("encoding is %d bytes, want %d", len(a), want)
	}
	// The instruction array is the kernel's sock_filter array as it lies
	// in memory on this (little-endian) machine.
	if nativeBigEndian() {
		t.Skip("the raw-layout check is for little-endian machines")
	}
	if n := len(fresh.raw) * insnLen; !bytes.Equal(a[headerLen:headerLen+n], rawBytes(fresh.raw)) {
		t.Fatal("encoded instructions are not the raw sock_filter array")
	}
}

// rawBytes is the in-memory layout of prog.
func rawBytes(prog []unix.SockFilter) []byte {
	var b []byte
	for _, in := range prog {
		b = binary.NativeEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.NativeEndian.AppendUint32(b, in.K)
	}
	return b
}

// TestDecodedDecides: the decoded program answers as the compiled one on
// calls the package doc names (through the tests' VM).
func TestDecodedDecides(t *testing.T) {
	f, err := Decode(mustEncode(t, mustDefault(t)))
	if err != nil {
		t.Fatal(err)
	}
	// The VM runs the compiler's form: rebuilt here from the raw program
	// the kernel would get.
	raws := make([]bpf.RawInstruction, len(f.raw))
	for i, r := range f.raw {
		raws[i] = bpf.RawInstruction{Op: r.Code, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	var all bool
	if f.insts, all = bpf.Disassemble(raws); !all {
		t.Fatal("the decoded program has an instruction the VM does not know")
	}
	info := nativeArch[runtime.GOARCH]
	for _, tc := range []struct {
		call string
		args []uint64
		want uint32
	}{
		{"read", nil, retAllow},
		{"unshare", []uint64{unix.CLONE_NEWUSER}, retEPERM},
		{"clone", []uint64{uint64(unix.SIGCHLD) | unix.CLONE_NEWUSER}, retEPERM},
		{"clone3", nil, retENOSYS},
		{"keyctl", nil, retEPERM},
		{"ioctl", []uint64{3, btrfsIocSubvolCreate}, retEPERM},
		{"ioctl", []uint64{3, unix.TIOCGWINSZ}, retAllow},
	} {
		name, _ := tableName(info, tc.call)
		if got := eval(t, f, uint32(info.ID), uint32(info.SyscallNames[name]), tc.args...); got != tc.want {
			t.Errorf("%s%v: got %#x, want %#x", tc.call, tc.args, got, tc.want)
		}
	}
}

// TestDecodeRefuses: anything but an intact program is refused with
// ErrCorrupt, never turned into a filter (the attack: a program cut
// short, or one instruction changed to let a denied call through).
func TestDecodeRefuses(t *testing.T) {
	good := mustEncode(t, mustDefault(t))
	info := nativeArch[runtime.GOARCH]
	// resum recomputes the checksum, so the check under test is the one
	// that must catch the change.
	resum := func(b []byte) []byte {
		b = slices.Clone(b[:len(b)-sumLen])
		s := sha256.Sum256(b)
		return append(b, s[:]...)
	}
	edit := func(f func(b []byte)) []byte {
		b := slices.Clone(good)
		f(b)
		return b
	}
	lastK := len(good) - sumLen - 4 // the default action's return value
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header only", good[:headerLen]},
		{"truncated by one byte", good[:len(good)-1]},
		{"truncated by one instruction, checksum dropped", slices.Concat(good[:len(good)-sumLen-insnLen])},
		{"truncated by one instruction, checksum recomputed", resum(slices.Concat(good[:len(good)-sumLen-insnLen], good[len(good)-sumLen:]))},
		{"one byte appended", append(slices.Clone(good), 0)},
		{"default action turned into allow", edit(func(b []byte) {
			binary.LittleEndian.PutUint32(b[lastK:], unix.SECCOMP_RET_ALLOW)
		})},
		{"a jump changed", edit(func(b []byte) { b[headerLen+insnLen+2] ^= 1 })},
		{"checksum changed", edit(func(b []byte) { b[len(b)-1] ^= 0x80 })},
		{"wrong magic", resum(edit(func(b []byte) { b[0] = 'X' }))},
		{"version 2", resum(edit(func(b []byte) { binary.LittleEndian.PutUint16(b[4:], 2) }))},
		{"another architecture", resum(edit(func(b []byte) { binary.LittleEndian.PutUint32(b[8:], uint32(info.ID)^1) }))},
		{"count one more than present", resum(edit(func(b []byte) {
			binary.LittleEndian.PutUint32(b[12:], binary.LittleEndian.Uint32(b[12:])+1)
		}))},
		{"count zero", resum(slices.Concat(good[:12], []byte{0, 0, 0, 0}, good[len(good)-sumLen:]))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Decode(tc.b)
			if !errors.Is(err, ErrCorrupt) || f != nil {
				t.Fatalf("Decode: got %v, %v; want nil and ErrCorrupt", f, err)
			}
		})
	}
	if _, err := Decode(good); err != nil {
		t.Fatalf("the intact program: %v", err)
	}
}
