// Package life is runnerd's lifetime as its long-lived work sees it: a
// context that ends when runnerd begins shutting down, and a count of the
// handlers and deferred work still running, so Run can wait for them.
// The HTTP face and the managers share one Life; Run owns it (BeginStop,
// Wait, End).
package life

import (
	"context"
	"sync"
)

// Life is one runnerd's lifetime. Safe for concurrent use.
type Life struct {
	ctx context.Context
	end context.CancelFunc
	// wg counts the tracked work; Add happens only under mu while
	// !stopping, so Wait never races an Add.
	wg sync.WaitGroup

	mu       sync.Mutex // guards stopping
	stopping bool
}

// New returns a lifetime begun; its owner must call End (or BeginStop).
func New() *Life {
	ctx, end := context.WithCancel(context.Background())
	return &Life{ctx: ctx, end: end}
}

// Context ends when runnerd begins shutting down.
func (l *Life) Context() context.Context { return l.ctx }

// Done is Context's Done channel.
func (l *Life) Done() <-chan struct{} { return l.ctx.Done() }

// End ends the lifetime without refusing new work (an early return of
// Run); BeginStop does both.
func (l *Life) End() { l.end() }

// Track registers a long-lived handler. It returns false once runnerd is
// stopping; otherwise the caller must call done when it returns.
func (l *Life) Track() (done func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopping {
		return nil, false
	}
	l.wg.Add(1)
	return l.wg.Done, true
}

// BeginStop makes Track refuse and wakes every tracked handler.
func (l *Life) BeginStop() {
	l.mu.Lock()
	l.stopping = true
	l.mu.Unlock()
	l.end()
}

// Wait waits for the tracked work; call it after BeginStop.
func (l *Life) Wait() { l.wg.Wait() }

// UntilStop returns a context that also ends when runnerd begins shutting
// down. The caller must call its cancel.
func (l *Life) UntilStop(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(l.ctx, cancel)
	return ctx, func() {
		unhook()
		cancel()
	}
}

// Later runs fn in a goroutine the lifetime tracks (Run waits for it), or
// at once when runnerd is stopping: work that must be done but need not
// be waited for by the answer in hand.
func (l *Life) Later(fn func()) {
	if done, ok := l.Track(); ok {
		go func() {
			defer done()
			fn()
		}()
		return
	}
	fn()
}
