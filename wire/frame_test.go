package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// must unwraps an encoder's result; the encoders fail only on invalid input,
// which is a bug in the test itself.
func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// sampleStream is a well-formed frame stream: data on both streams, a
// heartbeat, and an exit frame.
func sampleStream(t testing.TB) []byte {
	t.Helper()
	var b []byte
	b = must(AppendData(b, StreamStdout, 0, []byte("hello ")))
	b = must(AppendData(b, StreamStderr, 0, []byte("oops\n")))
	b = AppendHeartbeat(b)
	b = must(AppendData(b, StreamStdout, 6, []byte("world\n")))
	b = must(AppendExit(b, Exit{Reason: ExitExited, Code: 3,
		Lengths: map[string]int64{"stdout": 12, "stderr": 5}, Time: time.Unix(1700000000, 0).UTC()}))
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	b := sampleStream(t)
	d := NewDecoder(bytes.NewReader(b))
	type got struct {
		kind   FrameKind
		stream StreamID
		off    int64
		data   string
	}
	want := []got{
		{FrameData, StreamStdout, 0, "hello "},
		{FrameData, StreamStderr, 0, "oops\n"},
		{FrameHeartbeat, 0, 0, ""},
		{FrameData, StreamStdout, 6, "world\n"},
	}
	for i, w := range want {
		f, err := d.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		g := got{f.Kind, f.Stream, f.Offset, string(f.Payload)}
		if g != w {
			t.Fatalf("frame %d: got %+v, want %+v", i, g, w)
		}
		if f.Kind.Terminal() {
			t.Fatalf("frame %d: %s is terminal", i, f.Kind)
		}
	}
	f, err := d.Next()
	if err != nil {
		t.Fatal(err)
	}
	if f.Kind != FrameExit || !f.Kind.Terminal() {
		t.Fatalf("got %s, want terminal exit", f.Kind)
	}
	e, err := f.Exit()
	if err != nil {
		t.Fatal(err)
	}
	if e.Code != 3 || e.Reason != ExitExited || e.Lengths["stdout"] != 12 || e.Lengths["stderr"] != 5 {
		t.Fatalf("got exit %+v", e)
	}
	if _, err := d.Next(); err != io.EOF {
		t.Fatalf("after the last frame: got %v, want io.EOF", err)
	}
}

func TestTerminalFrames(t *testing.T) {
	var b []byte
	b = must(AppendLost(b, Exit{Reason: "exited", Code: 0, Detail: "shim gone"}))
	b = must(AppendError(b, Error{Code: CodeTruncated, Detail: "cursor 5 before 10"}))
	b = append(b, FrameMagic, FrameVersion, byte(FrameLost), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	d := NewDecoder(bytes.NewReader(b))

	f, err := d.Next()
	if err != nil {
		t.Fatal(err)
	}
	e, err := f.Exit()
	if err != nil || f.Kind != FrameLost || e.Reason != ExitLost || e.Detail != "shim gone" {
		t.Fatalf("lost: got %s %+v %v, want lost with reason lost", f.Kind, e, err)
	}
	f, err = d.Next()
	if err != nil {
		t.Fatal(err)
	}
	ee, err := f.Err()
	if err != nil || ee.Code != CodeTruncated {
		t.Fatalf("error: got %+v %v, want code truncated", ee, err)
	}
	f, err = d.Next()
	if err != nil {
		t.Fatal(err)
	}
	if e, err := f.Exit(); err != nil || e.Reason != ExitLost {
		t.Fatalf("empty lost: got %+v %v, want reason lost", e, err)
	}
	if _, err := f.Err(); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("Err of a lost frame: got %v, want ErrBadFrame", err)
	}
}

func header(kind, stream byte, off uint64, n uint32) []byte {
	h := make([]byte, FrameHeaderLen)
	h[0], h[1], h[2], h[3] = FrameMagic, FrameVersion, kind, stream
	binary.BigEndian.PutUint64(h[4:], off)
	binary.BigEndian.PutUint32(h[12:], n)
	return h
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"one byte", []byte{FrameMagic}, io.ErrUnexpectedEOF},
		{"bad magic", append([]byte{'{'}, header(1, 1, 0, 1)[1:]...), ErrBadMagic},
		{"bad version", append([]byte{FrameMagic, 2}, header(1, 1, 0, 1)[2:]...), ErrBadVersion},
		{"oversized", header(1, 1, 0, MaxFramePayload+1), ErrFrameTooLarge},
		{"huge", header(1, 1, 0, 0xffffffff), ErrFrameTooLarge},
		{"unknown kind", header(9, 0, 0, 0), ErrBadFrame},
		{"kind zero", header(0, 0, 0, 0), ErrBadFrame},
		{"data without stream", append(header(1, 0, 0, 1), 'x'), ErrBadFrame},
		{"data stream 3", append(header(1, 3, 0, 1), 'x'), ErrBadFrame},
		{"empty data", header(1, 1, 0, 0), ErrBadFrame},
		{"negative offset", append(header(1, 1, 1<<63, 1), 'x'), ErrBadFrame},
		{"heartbeat with payload", append(header(2, 0, 0, 1), 'x'), ErrBadFrame},
		{"heartbeat with stream", header(2, 1, 0, 0), ErrBadFrame},
		{"exit with offset", append(header(3, 0, 7, 2), '{', '}'), ErrBadFrame},
		{"cut in payload", append(header(1, 1, 0, 10), "short"...), io.ErrUnexpectedEOF},
		{"cut after header", header(1, 1, 0, 10), io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(bytes.NewReader(tt.in))
			f, err := d.Next()
			if !errors.Is(err, tt.want) {
				t.Fatalf("got frame %+v err %v, want %v", f, err, tt.want)
			}
			if _, err2 := d.Next(); !errors.Is(err2, tt.want) {
				t.Fatalf("second Next: got %v, want the sticky %v", err2, tt.want)
			}
		})
	}
}

// TestDecodeCutAnywhere cuts a valid stream at every byte: the decoder must
// yield only whole frames and then io.ErrUnexpectedEOF (or io.EOF exactly at
// a frame boundary), never a frame made of partial bytes.
func TestDecodeCutAnywhere(t *testing.T) {
	full := sampleStream(t)
	var bounds []int // offsets where a frame ends
	d := NewDecoder(bytes.NewReader(full))
	pos := 0
	for {
		f, err := d.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		pos += FrameHeaderLen + len(f.Payload)
		bounds = append(bounds, pos)
	}
	for cut := 0; cut < len(full); cut++ {
		// One byte per Read exercises every partial-read path too.
		d := NewDecoder(iotest.OneByteReader(bytes.NewReader(full[:cut])))
		n, end := 0, 0
		for {
			f, err := d.Next()
			if err == nil {
				end += FrameHeaderLen + len(f.Payload)
				n++
				continue
			}
			atBoundary := cut == 0 || (n > 0 && bounds[n-1] == cut)
			if atBoundary && err != io.EOF {
				t.Fatalf("cut %d at a boundary: got %v, want io.EOF", cut, err)
			}
			if !atBoundary && err != io.ErrUnexpectedEOF {
				t.Fatalf("cut %d inside frame %d: got %v, want io.ErrUnexpectedEOF", cut, n, err)
			}
			break
		}
		if end > cut {
			t.Fatalf("cut %d: decoded %d bytes of frames", cut, end)
		}
	}
}

func TestParseFrame(t *testing.T) {
	one := must(AppendData(nil, StreamStderr, 42, []byte("abc")))
	f, err := ParseFrame(one)
	if err != nil || f.Stream != StreamStderr || f.Offset != 42 || string(f.Payload) != "abc" || f.End() != 45 {
		t.Fatalf("got %+v %v", f, err)
	}
	if _, err := ParseFrame(one[:len(one)-1]); err != io.ErrUnexpectedEOF {
		t.Fatalf("short message: got %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ParseFrame(one[:3]); err != io.ErrUnexpectedEOF {
		t.Fatalf("short header: got %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ParseFrame(append(one, 0)); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("trailing byte: got %v, want ErrBadFrame", err)
	}
}

func TestEncodeRejects(t *testing.T) {
	big := make([]byte, MaxFramePayload+1)
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"too large", second(AppendData(nil, StreamStdout, 0, big)), ErrFrameTooLarge},
		{"empty", second(AppendData(nil, StreamStdout, 0, nil)), ErrBadFrame},
		{"bad stream", second(AppendData(nil, 7, 0, []byte("x"))), ErrBadFrame},
		{"negative offset", second(AppendData(nil, StreamStdout, -1, []byte("x"))), ErrBadFrame},
		{"frame kind 0", second(AppendFrame(nil, Frame{})), ErrBadFrame},
		{"heartbeat payload", second(AppendFrame(nil, Frame{Kind: FrameHeartbeat, Payload: []byte("x")})), ErrBadFrame},
		{"exit too large", second(AppendExit(nil, Exit{Detail: strings.Repeat("x", MaxFramePayload)})), ErrFrameTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !errors.Is(tt.err, tt.want) {
				t.Fatalf("got %v, want %v", tt.err, tt.want)
			}
		})
	}
	b, err := AppendFrame([]byte("prefix"), Frame{Kind: FrameData, Stream: StreamStdout, Offset: 1, Payload: []byte("y")})
	if err != nil || !bytes.HasPrefix(b, []byte("prefix")) || len(b) != 6+FrameHeaderLen+1 {
		t.Fatalf("AppendFrame: got %q %v", b, err)
	}
}

func second(_ []byte, err error) error { return err }

func TestStreamNames(t *testing.T) {
	for _, n := range []string{"stdout", "stderr"} {
		id, ok := StreamByName(n)
		if !ok || id.StreamName() != n {
			t.Fatalf("%s: got %d %v", n, id, ok)
		}
	}
	if _, ok := StreamByName("stdin"); ok {
		t.Fatal("stdin is not a stream")
	}
	if StreamID(9).StreamName() != "" || FrameKind(9).String() != "kind(9)" {
		t.Fatal("unknown ids must not name a stream or kind")
	}
}

func TestAppendDataAllocs(t *testing.T) {
	p := make([]byte, 64<<10)
	buf := make([]byte, 0, FrameHeaderLen+len(p))
	allocs := testing.AllocsPerRun(100, func() {
		buf, _ = AppendData(buf[:0], StreamStdout, 1<<40, p)
	})
	if allocs != 0 {
		t.Fatalf("AppendData: got %v allocs, want 0", allocs)
	}
}

func BenchmarkAppendData64K(b *testing.B) {
	p := make([]byte, 64<<10)
	buf := make([]byte, 0, FrameHeaderLen+len(p))
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		buf, _ = AppendData(buf[:0], StreamStdout, int64(i)<<16, p)
	}
}

// repeatReader serves the same bytes forever.
type repeatReader struct {
	b   []byte
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := copy(p, r.b[r.off:])
	r.off = (r.off + n) % len(r.b)
	return n, nil
}

func BenchmarkDecode64K(b *testing.B) {
	frame, err := AppendData(nil, StreamStdout, 0, make([]byte, 64<<10))
	if err != nil {
		b.Fatal(err)
	}
	d := NewDecoder(&repeatReader{b: frame})
	b.SetBytes(64 << 10)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecode feeds arbitrary bytes to the decoder: it must never panic,
// every frame it yields must re-encode to exactly the bytes it was read
// from, and decoding must stop with an error or io.EOF.
func FuzzDecode(f *testing.F) {
	f.Add(sampleStream(f))
	f.Add(header(1, 1, 0, 3))
	f.Add(AppendHeartbeat(nil))
	f.Add([]byte{FrameMagic})
	f.Fuzz(func(t *testing.T, in []byte) {
		d := NewDecoder(bytes.NewReader(in))
		pos := 0
		for {
			fr, err := d.Next()
			if err != nil {
				if err == io.EOF && pos != len(in) {
					t.Fatalf("io.EOF at %d of %d bytes", pos, len(in))
				}
				return
			}
			n := FrameHeaderLen + len(fr.Payload)
			re, err := AppendFrame(nil, fr)
			if err != nil {
				t.Fatalf("decoded frame does not re-encode: %v", err)
			}
			if !bytes.Equal(re, in[pos:pos+n]) {
				t.Fatalf("re-encoded %x, read %x", re, in[pos:pos+n])
			}
			if g, err := ParseFrame(in[pos : pos+n]); err != nil || !bytes.Equal(g.Payload, fr.Payload) {
				t.Fatalf("ParseFrame disagrees with Decoder: %v", err)
			}
			pos += n
		}
	})
}
