package adapter

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestExitValid(t *testing.T) {
	tests := []struct {
		name string
		e    Exit
		want bool
		ok   bool
	}{
		{"exit 0", Exit{Code: 0, Reason: ReasonExited}, true, true},
		{"exit 3", Exit{Code: 3, Reason: ReasonExited}, true, false},
		{"signaled", Exit{Code: -1, Signal: "SIGKILL", Reason: ReasonSignaled}, true, false},
		{"signal read as 0", Exit{Code: 0, Signal: "SIGKILL", Reason: ReasonSignaled}, false, false},
		{"exited with a signal", Exit{Code: -1, Signal: "SIGTERM", Reason: ReasonExited}, false, false},
		{"terminated by signal", Exit{Code: -1, Signal: "SIGTERM", Reason: ReasonTerminated}, true, false},
		{"terminated with a code", Exit{Code: 143, Reason: ReasonTerminated}, true, false},
		{"no reason", Exit{}, false, true},
		{"code out of range", Exit{Code: 256, Reason: ReasonExited}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.e.Valid(); got != tt.want {
				t.Errorf("%+v.Valid() = %v, want %v", tt.e, got, tt.want)
			}
			if got := tt.e.Success(); got != tt.ok {
				t.Errorf("%+v.Success() = %v, want %v", tt.e, got, tt.ok)
			}
		})
	}
}

func TestCursorAdvance(t *testing.T) {
	var c Cursor
	c.Advance(Frame{Stream: Stdout, Offset: 0, Data: []byte("abc")})
	c.Advance(Frame{Stream: Stderr, Offset: 0, Data: []byte("e")})
	c.Advance(Frame{Stream: Stdout, Offset: 3, Data: []byte("de")})
	c.Advance(Frame{Exit: &Exit{Reason: ReasonExited}})
	if c != (Cursor{Stdout: 5, Stderr: 1}) {
		t.Errorf("cursor = %+v, want {5 1}", c)
	}
	if c.At(Stderr) != 1 || c.At(Stdout) != 5 {
		t.Errorf("At = %d/%d, want 5/1", c.At(Stdout), c.At(Stderr))
	}
}

func TestFeed(t *testing.T) {
	ctx := context.Background()
	t.Run("terminal closes the channel", func(t *testing.T) {
		f := NewFeed("s1", 4, nil)
		if err := f.Send(ctx, Frame{Stream: Stdout, Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if err := f.Send(ctx, Frame{Exit: &Exit{Reason: ReasonExited}}); err != nil {
			t.Fatal(err)
		}
		var n int
		for range f.Frames() {
			n++
		}
		if n != 2 {
			t.Errorf("got %d frames, want 2", n)
		}
	})
	t.Run("close unblocks a full send", func(t *testing.T) {
		closed := make(chan struct{})
		f := NewFeed("s1", 1, func() { close(closed) })
		if err := f.Send(ctx, Frame{Stream: Stdout, Data: []byte("1")}); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- f.Send(ctx, Frame{Stream: Stdout, Data: []byte("2")}) }()
		time.Sleep(10 * time.Millisecond)
		f.Close()
		f.Close()
		if err := <-errc; !errors.Is(err, ErrDetached) {
			t.Errorf("Send after Close = %v, want ErrDetached", err)
		}
		<-closed
		for range f.Frames() { // the channel is closed: this terminates
		}
	})
	t.Run("context ends a blocked send", func(t *testing.T) {
		f := NewFeed("s1", 1, nil)
		_ = f.Send(ctx, Frame{})
		cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		if err := f.Send(cctx, Frame{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Send = %v, want DeadlineExceeded", err)
		}
	})
}
