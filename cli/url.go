package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// urlPollInterval is how often `runner url --wait` asks again. Each ask is
// one small request that runnerd answers from the kernel's socket table.
const urlPollInterval = 200 * time.Millisecond

// errNotYetListening marks a --wait that ran out: the URL exists, nothing
// listens on its port.
var errNotYetListening = errors.New("nothing listens yet")

// previewURLWait asks runnerd for the preview URL of port in sandbox and,
// with wait > 0, asks again until something listens on the port or wait
// has passed (then an unavailable error wrapping errNotYetListening:
// the server may still come; nothing is broken). Each ask is bounded by
// --timeout; asking again returns the same URL.
func previewURLWait(ctx context.Context, e *env, c *client.Client, sandbox string, port int, wait time.Duration) (wire.URL, error) {
	deadline := time.Now().Add(wait)
	for {
		cctx, cancel := e.callCtx(ctx)
		u, err := c.PreviewURL(cctx, sandbox, port)
		cancel()
		if err != nil {
			return wire.URL{}, err
		}
		if wait == 0 || u.Listening == nil || *u.Listening {
			return u, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return wire.URL{}, fmt.Errorf("%w: %w", &adapter.UnavailableError{
				Detail: fmt.Sprintf("nothing listens on port %d in sandbox %s after --wait %s", port, sandbox, wait),
			}, errNotYetListening)
		}
		t := time.NewTimer(min(urlPollInterval, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return wire.URL{}, ctx.Err()
		case <-t.C:
		}
	}
}

// notYetListening reports whether err is a --wait that ran out.
func notYetListening(err error) bool { return errors.Is(err, errNotYetListening) }
