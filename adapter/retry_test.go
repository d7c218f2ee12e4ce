package adapter

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWithBackoff(t *testing.T) {
	fast := Backoff{Base: time.Millisecond, Max: 4 * time.Millisecond, Attempts: 4}
	tests := []struct {
		name      string
		errs      []error // returned by successive calls; nil after the end
		wantCalls int
		wantErr   error
	}{
		{"success first", nil, 1, nil},
		{"transient then success", []error{&UnavailableError{Detail: "x"}, nil}, 2, nil},
		{"definitive stops at once", []error{ErrNotFound}, 1, ErrNotFound},
		{"invalid stops at once", []error{&InvalidError{Detail: "x"}}, 1, ErrInvalid},
		{"attempts run out", []error{&UnavailableError{}, &UnavailableError{}, &UnavailableError{}, &UnavailableError{}, nil}, 4, ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := WithBackoff(context.Background(), fast, func(context.Context) error {
				calls++
				if calls <= len(tt.errs) {
					return tt.errs[calls-1]
				}
				return nil
			})
			if calls != tt.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
			}
			if (tt.wantErr == nil) != (err == nil) || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestWithBackoffHonoursRetryAfter(t *testing.T) {
	b := Backoff{Base: time.Millisecond, Max: time.Millisecond, Attempts: 2}
	start := time.Now()
	calls := 0
	err := WithBackoff(context.Background(), b, func(context.Context) error {
		calls++
		if calls == 1 {
			return &RateLimitedError{RetryAfter: 60 * time.Millisecond}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Since(start); got < 60*time.Millisecond {
		t.Errorf("retried after %v, want at least the 60ms RetryAfter", got)
	}
}

func TestWithBackoffHonoursContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	b := Backoff{Base: time.Hour, Max: time.Hour, Attempts: 3}
	start := time.Now()
	err := WithBackoff(ctx, b, func(context.Context) error { return &UnavailableError{Detail: "down"} })
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrUnavailable) {
		t.Errorf("err = %v, want DeadlineExceeded joined with the last unavailable", err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("WithBackoff ignored the context")
	}
}

func TestBackoffDelay(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: 400 * time.Millisecond}
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 9: 400 * time.Millisecond} {
		for range 50 {
			if d := b.Delay(n); d < want/2 || d > want {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", n, d, want/2, want)
			}
		}
	}
}
