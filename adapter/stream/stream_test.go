package stream_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/wire"
)

// frames encodes fs as runner-shim attach writes them.
func frames(t *testing.T, fs ...wire.Frame) []byte {
	t.Helper()
	var b []byte
	for _, f := range fs {
		var err error
		if b, err = wire.AppendFrame(b, f); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func data(s wire.StreamID, off int64, p string) wire.Frame {
	return wire.Frame{Kind: wire.FrameData, Stream: s, Offset: off, Payload: []byte(p)}
}

func exitFrame(t *testing.T, e wire.Exit) wire.Frame {
	b, err := wire.AppendExit(nil, e)
	if err != nil {
		t.Fatal(err)
	}
	f, err := wire.ParseFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// conn is a decoder Conn over the given bytes, as a provider's exec API
// would hand runner-shim attach's stdout over.
func conn(b []byte, from adapter.Cursor) stream.Conn {
	return stream.NewDecoderConn("session s1", io.NopCloser(bytes.NewReader(b)), from)
}

func collect(t *testing.T, st adapter.Stream) []adapter.Frame {
	t.Helper()
	var out []adapter.Frame
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-st.Frames():
			if !ok {
				return out
			}
			out = append(out, f)
		case <-timeout:
			t.Fatalf("no end after %d frames", len(out))
		}
	}
}

// TestStreamReattachesFromCursor: a cut without a terminal frame is
// dialed again from exactly the bytes the consumer has, and the consumer
// sees each byte once and the exit.
func TestStreamReattachesFromCursor(t *testing.T) {
	first := frames(t, data(wire.StreamStdout, 0, "hel"), data(wire.StreamStderr, 0, "e1"))
	var mu sync.Mutex
	var dialed []adapter.Cursor
	dial := func(ctx context.Context, from adapter.Cursor) (stream.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		dialed = append(dialed, from)
		return conn(frames(t, data(wire.StreamStdout, 3, "lo"), exitFrame(t, wire.Exit{Reason: wire.ExitExited, Code: 3})), from), nil
	}
	st := stream.New("s1", conn(first, adapter.Cursor{}), adapter.Cursor{}, dial, stream.Options{Provider: "p", ReattachWindow: 5 * time.Second})
	defer st.Close()
	got := collect(t, st)
	mu.Lock()
	defer mu.Unlock()
	if len(dialed) != 1 || dialed[0] != (adapter.Cursor{Stdout: 3, Stderr: 2}) {
		t.Fatalf("dialed from %v, want once from stdout 3 stderr 2", dialed)
	}
	var out, errb string
	for _, f := range got[:len(got)-1] {
		if f.Stream == adapter.Stdout {
			out += string(f.Data)
		} else {
			errb += string(f.Data)
		}
	}
	last := got[len(got)-1]
	if out != "hello" || errb != "e1" || last.Exit == nil || last.Exit.Code != 3 || last.Exit.Reason != adapter.ReasonExited {
		t.Fatalf("frames %v: stdout %q stderr %q, want hello, e1 and exit 3", got, out, errb)
	}
}

// TestStreamEnds: every way a stream ends is exactly one terminal frame
// of the right kind, never an exit for anything but an exit record.
func TestStreamEnds(t *testing.T) {
	lost, _ := wire.AppendLost(nil, wire.Exit{Detail: "shim gone"})
	lostF, _ := wire.ParseFrame(lost)
	errB, _ := wire.AppendError(nil, wire.Error{Code: wire.CodeCommandExited, Detail: "x"})
	errF, _ := wire.ParseFrame(errB)
	tests := []struct {
		name   string
		bytes  []byte
		window time.Duration
		want   adapter.Kind
	}{
		{"lost", frames(t, data(wire.StreamStdout, 0, "a"), lostF), 0, adapter.KindLost},
		{"error frame", frames(t, errF), 0, adapter.KindCommandExited},
		{"cut, no window", frames(t, data(wire.StreamStdout, 0, "a")), 0, adapter.KindUnavailable},
		{"cut, redial refused", frames(t, data(wire.StreamStdout, 0, "a")), time.Second, adapter.KindUnavailable},
		{"gap", frames(t, data(wire.StreamStdout, 1, "a")), 0, adapter.KindUnavailable},
		{"garbage", []byte("not frames at all, just text"), 0, adapter.KindUnavailable},
		{"signal death", frames(t, exitFrame(t, wire.Exit{Reason: wire.ExitSignaled, Signal: 9})), 0, adapter.KindNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dial := func(ctx context.Context, from adapter.Cursor) (stream.Conn, error) {
				return nil, &adapter.DeniedError{Detail: "refused"}
			}
			st := stream.New("s1", conn(tc.bytes, adapter.Cursor{}), adapter.Cursor{}, dial, stream.Options{Provider: "p", ReattachWindow: tc.window})
			defer st.Close()
			got := collect(t, st)
			last := got[len(got)-1]
			if !last.Terminal() {
				t.Fatalf("frames %v end without a terminal frame", got)
			}
			if k := adapter.KindOf(last.Err); k != tc.want {
				t.Fatalf("terminal %v: kind %s, want %s", last, k, tc.want)
			}
			if tc.want == adapter.KindNone && (last.Exit == nil || last.Exit.Signal != "SIGKILL" || last.Exit.Code != -1) {
				t.Fatalf("terminal %v, want a SIGKILL death with code -1", last)
			}
		})
	}
}

// TestStreamCloseStopsProducer: Close while the producer waits for a
// frame or a redial returns, with the channel closed and no terminal
// frame invented.
func TestStreamCloseStopsProducer(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	pw2 := make(chan struct{})
	go func() { // a writer this test owns; it ends when the pipe closes
		defer close(pw2)
		pw.Write(frames(t, data(wire.StreamStdout, 0, "a")))
	}()
	st := stream.New("s1", stream.NewDecoderConn("s1", pr, adapter.Cursor{}), adapter.Cursor{}, nil, stream.Options{})
	f := <-st.Frames()
	if string(f.Data) != "a" {
		t.Fatalf("first frame %v", f)
	}
	done := make(chan struct{})
	go func() { st.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return while the producer waited")
	}
	if f, ok := <-st.Frames(); ok {
		t.Fatalf("frame %v after Close, want the channel closed", f)
	}
	<-pw2
	if !errors.Is(st.Close(), nil) {
		t.Fatal("second Close failed")
	}
}
