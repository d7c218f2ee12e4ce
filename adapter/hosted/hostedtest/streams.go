package hostedtest

import (
	"bytes"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// Collect reads st to its terminal frame and returns what each stream
// carried and that frame; it fails t when the stream closes without one
// or none comes within 60 s.
func Collect(t *testing.T, st adapter.Stream) (stdout, stderr []byte, end adapter.Frame) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case f, ok := <-st.Frames():
			if !ok {
				t.Fatal("stream closed without a terminal frame")
			}
			if f.Terminal() {
				return stdout, stderr, f
			}
			if f.Stream == adapter.Stderr {
				stderr = append(stderr, f.Data...)
			} else {
				stdout = append(stdout, f.Data...)
			}
		case <-timeout:
			t.Fatal("stream: no terminal frame in 60s")
		}
	}
}

// ReadUntil reads st's stdout until it holds want and returns what it
// read; it fails t when the stream ends first or want is not there
// within 30 s.
func ReadUntil(t *testing.T, st adapter.Stream, want string) []byte {
	t.Helper()
	var out []byte
	timeout := time.After(30 * time.Second)
	for !bytes.Contains(out, []byte(want)) {
		select {
		case f, ok := <-st.Frames():
			if !ok || f.Terminal() {
				t.Fatalf("stream ended (%v) before %q; got %q", f, want, out)
			}
			if f.Stream == adapter.Stdout {
				out = append(out, f.Data...)
			}
		case <-timeout:
			t.Fatalf("no %q in 30s; got %q", want, out)
		}
	}
	return out
}
