package sessions

// Bounded stdin. A stdin write holds its body in runnerd until the shim
// has taken it, and a command that never reads its stdin makes that
// forever: 100 concurrent 8 MiB writes once grew runnerd from 33 MB to
// 1.42 GB, and it stayed there after the callers gave up. So each
// session admits at most stdinMaxWrites writes at once (the one being
// delivered and those waiting behind it) holding at most stdinMaxBytes
// of bodies between them; a write past either bound is answered
// 429 rate_limited with retry_after_ms before its body is read. Admitted
// writes reach the shim one at a time, in the order they were admitted
// (stdin is one byte stream: two writes in flight at once would
// interleave at the shim's whim). A caller that gives up (its request
// context ends) leaves the queue at once, or stops its delivery, and its
// body is released; the next write in line goes on. docs/protocol.md
// states the numbers.

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/wire"
)

// The per-session bounds of stdin (docs/protocol.md, "stdin").
const (
	// stdinMaxWrites is the most stdin writes one session admits at once.
	stdinMaxWrites = 4
	// stdinMaxBytes is the most body bytes those writes hold together:
	// two bodies of wire.MaxStdinBody.
	stdinMaxBytes = 2 * wire.MaxStdinBody
	// stdinRetryAfter is the wait a rate_limited stdin answer asks for.
	stdinRetryAfter = time.Second
)

// stdinGates holds one stdinGate per session with writes admitted.
type stdinGates struct {
	mu    sync.Mutex // guards gates and every gate's fields
	gates map[string]*stdinGate
}

// stdinGate is one session's queue of admitted writes.
type stdinGate struct {
	bytes int64
	queue []chan struct{} // admitted writes in order; queue[0] delivers; each waits for its channel to close
}

// admit reserves n bytes (the body's length, or wire.MaxStdinBody when
// unknown) for a write to session key, or answers rate_limited. It
// returns wait, which blocks until the write's turn (or ctx's end, with
// ctx's error), and done, which the caller must call once the write is
// over (delivered, failed or abandoned) to release its place.
func (g *stdinGates) admit(key string, n int64) (wait func(ctx context.Context) error, done func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gate := g.gates[key]
	if gate == nil {
		gate = &stdinGate{}
		if g.gates == nil {
			g.gates = map[string]*stdinGate{}
		}
		g.gates[key] = gate
	}
	if len(gate.queue) >= stdinMaxWrites || gate.bytes+n > stdinMaxBytes {
		detail := fmt.Sprintf("session stdin: %d writes holding %d bytes wait for the command to read (at most %d writes and %d bytes per session)",
			len(gate.queue), gate.bytes, stdinMaxWrites, int64(stdinMaxBytes))
		if len(gate.queue) == 0 {
			delete(g.gates, key)
		}
		return nil, nil, &apierr.Error{Status: http.StatusTooManyRequests, Code: wire.CodeRateLimited, Detail: detail, RetryAfterMS: stdinRetryAfter.Milliseconds()}
	}
	turn := make(chan struct{})
	if len(gate.queue) == 0 {
		close(turn) // first in line: delivers now
	}
	gate.queue = append(gate.queue, turn)
	gate.bytes += n
	wait = func(ctx context.Context) error {
		select {
		case <-turn:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var once sync.Once
	done = func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			gate.bytes -= n
			for i, c := range gate.queue {
				if c != turn {
					continue
				}
				gate.queue = append(gate.queue[:i], gate.queue[i+1:]...)
				if i == 0 && len(gate.queue) > 0 {
					close(gate.queue[0]) // the next in line delivers
				}
				break
			}
			if len(gate.queue) == 0 {
				delete(g.gates, key)
			}
		})
	}
	return wait, done, nil
}

// AdmitStdin admits a stdin write of up to n bytes to session key under
// its bounds (stdinGates.admit): wait blocks until it is this write's
// turn, done ends it.
func (s *Manager) AdmitStdin(key string, n int64) (wait func(ctx context.Context) error, done func(), err error) {
	return s.stdin.admit(key, n)
}
