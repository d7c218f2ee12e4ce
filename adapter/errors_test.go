package adapter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestErrorKinds(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		kind      Kind
		sentinel  error
		transient bool
	}{
		{"nil", nil, KindNone, nil, false},
		{"not_found", ErrNotFound, KindNotFound, ErrNotFound, false},
		{"truncated", ErrTruncated, KindTruncated, ErrTruncated, false},
		{"not_supported", ErrNotSupported, KindNotSupported, ErrNotSupported, false},
		{"command_exited", ErrCommandExited, KindCommandExited, ErrCommandExited, false},
		{"lost", ErrLost, KindLost, ErrLost, false},
		{"rate_limited", &RateLimitedError{RetryAfter: time.Second}, KindRateLimited, ErrRateLimited, true},
		{"unavailable", &UnavailableError{Detail: "reset"}, KindUnavailable, ErrUnavailable, true},
		{"denied", &DeniedError{Detail: "401"}, KindDenied, ErrDenied, false},
		{"invalid", &InvalidError{Detail: "name"}, KindInvalid, ErrInvalid, false},
		{"restore_failed", &RestoreFailedError{Detail: "disk"}, KindRestoreFailed, ErrRestoreFailed, false},
		{"write_failed", &WriteFailedError{Detail: "pipe"}, KindWriteFailed, ErrWriteFailed, false},
		{"provider", &ProviderError{Provider: "x", Detail: "teapot"}, KindProvider, ErrProvider, false},
		{"wrapped unavailable", fmt.Errorf("get sandbox a: %w", &UnavailableError{Detail: "503"}), KindUnavailable, ErrUnavailable, true},
		{"context", fmt.Errorf("exec: %w", context.DeadlineExceeded), KindContext, context.DeadlineExceeded, false},
		{"outside taxonomy", errors.New("boom"), KindProvider, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := KindOf(tt.err); got != tt.kind {
				t.Errorf("KindOf = %q, want %q", got, tt.kind)
			}
			if got := Transient(tt.err); got != tt.transient {
				t.Errorf("Transient = %v, want %v", got, tt.transient)
			}
			if tt.sentinel != nil && !errors.Is(tt.err, tt.sentinel) {
				t.Errorf("errors.Is(%v, %v) = false, want true", tt.err, tt.sentinel)
			}
			// No error is two kinds at once, and nothing but ErrNotFound
			// is ErrNotFound.
			if tt.kind != KindNotFound && errors.Is(tt.err, ErrNotFound) {
				t.Errorf("%v matches ErrNotFound", tt.err)
			}
		})
	}
}

func TestErrorsAs(t *testing.T) {
	err := fmt.Errorf("list: %w", &RateLimitedError{RetryAfter: 3 * time.Second})
	var rl *RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 3*time.Second {
		t.Fatalf("errors.As RateLimitedError: got %v, want RetryAfter 3s", rl)
	}
	var pe *ProviderError
	if !errors.As(fmt.Errorf("x: %w", &ProviderError{Provider: "p", Detail: "d"}), &pe) || pe.Provider != "p" {
		t.Fatalf("errors.As ProviderError: got %v", pe)
	}
}
