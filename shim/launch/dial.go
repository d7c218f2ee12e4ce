package launch

import (
	"context"
	"time"
)

// Budget is how long a caller may spend on one errand to a shim: the dial
// and every call it then makes with the client. runnerd dials shims only
// through DialFor with one of these, so every timeout it keeps with a shim
// is listed here, in one place, instead of beside each call.
//
// A live shim accepts at once and answers a status at once (its control
// socket is served by goroutines that never wait for the command or the
// journal), so a budget bounds a shim that is stopped, swapped out or
// gone, never a normal answer; an errand that waits on purpose (for the
// command's end after a terminate) gets the wait added.
type Budget struct {
	d time.Duration // 0: the caller's context alone bounds the errand
}

var (
	// Query is a read made on a request's path (status, write error, a
	// disk-full check): short, since the request waits for it and a
	// missing answer has a fallback.
	Query = Budget{2 * time.Second}
	// Check is a read runnerd decides on (has the command ended, are
	// processes left under the shim): a little longer than Query.
	Check = Budget{5 * time.Second}
	// Kill is a terminate without grace and the wait for its exit record.
	Kill = Budget{10 * time.Second}
	// Control is what a client asked of the command: stdin, close-stdin,
	// resize, signal. A stdin write waits for the command to read it.
	Control = Budget{30 * time.Second}
	// Request is bounded by the caller's context alone (a stream request
	// that ends with its HTTP request).
	Request = Budget{}
)

// Stop is a terminate with grace and the wait for the command's exit
// record: the grace, then 5 s for the SIGKILL, the drain and the record.
func Stop(grace time.Duration) Budget { return Budget{grace + 5*time.Second} }

// StopTree is a terminate of the processes left under an ended command:
// the grace, then 10 s for the SIGKILL and the rescans until none is left.
func StopTree(grace time.Duration) Budget { return Budget{grace + 10*time.Second} }

// DialFor dials the shim of the session in dir (as Dial) for an errand
// within b. It returns the client and the context that bounds the errand
// (derived from ctx); the caller uses that context for its calls, then
// calls cancel and closes the client. On error the context is already
// cancelled.
func DialFor(ctx context.Context, dir string, b Budget) (*Client, context.Context, context.CancelFunc, error) {
	cancel := context.CancelFunc(func() {})
	if b.d > 0 {
		ctx, cancel = context.WithTimeout(ctx, b.d)
	}
	c, err := Dial(ctx, dir)
	if err != nil {
		cancel()
		return nil, ctx, cancel, err
	}
	return c, ctx, cancel, nil
}
