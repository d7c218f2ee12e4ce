package conformance

import (
	"bytes"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// closeWait is how long a stream may stay open after its terminal frame.
const closeWait = 2 * time.Second

// reader consumes a Stream and checks the frame contract on every frame:
// data frames contiguous from the cursor, per stream; exactly one terminal
// frame; nothing after it; a valid Exit; the channel closed after it.
type reader struct {
	e     *env
	st    adapter.Stream
	label string

	next      [2]int64  // expected offset of the next data frame per stream
	out       [2][]byte // data received per stream
	exit      *adapter.Exit
	err       error // terminal error frame
	terminals int
	closed    bool // the channel is closed
	timedOut  bool
}

func (e *env) reader(label string, st adapter.Stream, from adapter.Cursor) *reader {
	e.t.Cleanup(func() { _ = st.Close() })
	return &reader{e: e, st: st, label: label, next: [2]int64{from.Stdout, from.Stderr}}
}

func idx(s adapter.StreamName) int {
	if s == adapter.Stderr {
		return 1
	}
	return 0
}

// step reads one frame, or waits up to d (0: the subtest's context) for
// one. It returns false when the channel closed, the wait expired or the
// subtest's context ended.
func (r *reader) step(d time.Duration) bool {
	t := r.e.t
	t.Helper()
	if r.closed || r.timedOut {
		return false
	}
	var timeout <-chan time.Time
	if d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		timeout = tm.C
	}
	var f adapter.Frame
	var ok bool
	select {
	case f, ok = <-r.st.Frames():
	case <-timeout:
		return false
	case <-r.e.ctx.Done():
		r.timedOut = true
		t.Errorf("%s: context ended while waiting for frames (got stdout %s, stderr %s)", r.label, quoteAll(r.out[0]), quoteAll(r.out[1]))
		return false
	}
	if !ok {
		r.closed = true
		return false
	}
	if r.terminals > 0 {
		t.Errorf("%s: frame %v after the terminal frame: want exactly one terminal frame and nothing after it", r.label, f)
	}
	if !f.Terminal() {
		if f.Stream != adapter.Stdout && f.Stream != adapter.Stderr {
			t.Errorf("%s: data frame on stream %q, want stdout or stderr", r.label, f.Stream)
			return true
		}
		i := idx(f.Stream)
		if f.Offset != r.next[i] {
			t.Errorf("%s: %s frame at offset %d, want %d (bytes dropped or duplicated)", r.label, f.Stream, f.Offset, r.next[i])
		}
		r.out[i] = append(r.out[i], f.Data...)
		r.next[i] = f.Offset + int64(len(f.Data))
		return true
	}
	r.terminals++
	if f.Exit != nil && f.Err != nil {
		t.Errorf("%s: terminal frame carries both exit %v and error %v", r.label, *f.Exit, f.Err)
	}
	if len(f.Data) > 0 {
		t.Errorf("%s: terminal frame carries %d data bytes", r.label, len(f.Data))
	}
	if f.Exit != nil {
		if !f.Exit.Valid() {
			t.Errorf("%s: exit %+v breaks the Exit invariants (a signal death must have code -1)", r.label, *f.Exit)
		}
		if r.exit == nil && r.err == nil {
			e := *f.Exit
			r.exit = &e
		}
	} else if r.exit == nil && r.err == nil {
		r.err = f.Err
	}
	return true
}

// until reads until cond holds; it reports whether it did.
func (r *reader) until(cond func() bool) bool {
	r.e.t.Helper()
	for !cond() {
		if !r.step(0) {
			return cond()
		}
	}
	return true
}

// stdoutHas reads until stdout contains s.
func (r *reader) stdoutHas(s string) bool {
	r.e.t.Helper()
	return r.until(func() bool { return bytes.Contains(r.out[0], []byte(s)) || r.terminals > 0 }) &&
		bytes.Contains(r.out[0], []byte(s))
}

// quiet reads for d and reports whether no terminal frame arrived.
func (r *reader) quiet(d time.Duration) bool {
	r.e.t.Helper()
	deadline := time.Now().Add(d)
	for r.terminals == 0 {
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		if !r.step(left) && (r.closed || r.timedOut) {
			break
		}
	}
	return r.terminals == 0 && !r.closed
}

// rest reads to the end of the stream and checks it ended with exactly one
// terminal frame and a closed channel.
func (r *reader) rest() *reader {
	t := r.e.t
	t.Helper()
	for r.terminals == 0 && r.step(0) {
	}
	if r.terminals > 0 {
		deadline := time.Now().Add(closeWait)
		for !r.closed {
			left := time.Until(deadline)
			if left <= 0 {
				t.Errorf("%s: channel still open %v after the terminal frame", r.label, closeWait)
				break
			}
			if !r.step(left) && r.timedOut {
				break
			}
		}
	}
	if r.terminals == 0 && r.closed {
		t.Errorf("%s: channel closed without a terminal frame", r.label)
	}
	return r
}

// wantExit reads to the end and checks the terminal frame is an exit that
// satisfies ok.
func (r *reader) wantExit(what string, ok func(adapter.Exit) bool) adapter.Exit {
	t := r.e.t
	t.Helper()
	r.rest()
	switch {
	case r.exit == nil && r.err != nil:
		t.Errorf("%s: terminal frame is error %v, want %s", r.label, r.err, what)
	case r.exit == nil:
		t.Errorf("%s: no exit frame, want %s", r.label, what)
	case !ok(*r.exit):
		t.Errorf("%s: exit %+v, want %s", r.label, *r.exit, what)
	default:
		return *r.exit
	}
	return adapter.Exit{}
}

func success(e adapter.Exit) bool { return e.Success() && e.Reason == adapter.ReasonExited }

func code(n int) func(adapter.Exit) bool {
	return func(e adapter.Exit) bool { return e.Code == n && e.Signal == "" && e.Reason == adapter.ReasonExited }
}
