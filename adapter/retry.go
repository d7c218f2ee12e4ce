package adapter

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff is the policy of [WithBackoff]. The zero value is usable: 250 ms
// base, 10 s cap, 5 attempts.
type Backoff struct {
	// Base is the wait before the first retry; each retry doubles it.
	Base time.Duration
	// Max caps one computed wait (a rate limiter's RetryAfter may exceed it).
	Max time.Duration
	// Attempts is the total number of calls, first one included.
	Attempts int
}

func (b Backoff) withDefaults() Backoff {
	if b.Base <= 0 {
		b.Base = 250 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 10 * time.Second
	}
	if b.Max < b.Base {
		b.Max = b.Base
	}
	if b.Attempts <= 0 {
		b.Attempts = 5
	}
	return b
}

// Delay returns the wait before retry number n (1 for the first retry):
// Base*2^(n-1) capped at Max, with "equal jitter" (a uniform draw from the
// upper half), so concurrent callers spread out but never retry at once.
func (b Backoff) Delay(n int) time.Duration {
	b = b.withDefaults()
	d := b.Base
	for i := 1; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	return half + rand.N(half+1)
}

// WithBackoff calls fn until it succeeds, returns an error that is not
// [Transient], or the attempts run out; it returns fn's last error. Between
// attempts it waits [Backoff.Delay], or a *RateLimitedError's RetryAfter
// when that is longer, and returns early with ctx's error (joined with the
// last error) when ctx ends.
//
// Never wrap a non-idempotent call in WithBackoff: an *UnavailableError
// proves nothing about whether the first call took effect. Create (caller
// named), Get, List, Destroy, Attach, Sessions, Suspend, Resume,
// SetNetworkPolicy, PublicURL and Spawn with a caller-supplied SessionID are
// idempotent; Exec, WriteStdin and Spawn without a SessionID are not.
func WithBackoff(ctx context.Context, b Backoff, fn func(context.Context) error) error {
	b = b.withDefaults()
	var err error
	for attempt := 1; ; attempt++ {
		if err = fn(ctx); err == nil || !Transient(err) || attempt >= b.Attempts {
			return err
		}
		wait := b.Delay(attempt)
		var rl *RateLimitedError
		if errors.As(err, &rl) && rl.RetryAfter > wait {
			wait = rl.RetryAfter
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ctx.Err(), err)
		case <-t.C:
		}
	}
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
