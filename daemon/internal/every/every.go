// Package every runs the daemon's periodic work: one loop, stopped by its
// owner's context, so no ticker goroutine outlives what started it.
package every

import (
	"context"
	"time"
)

// Until calls fn every d until ctx ends or fn returns false. The
// daemon's periodic goroutines (janitor, sweepLeaves, an attach's pings)
// share it; their owner stops them through ctx.
func Until(ctx context.Context, d time.Duration, fn func() bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !fn() {
			return
		}
	}
}
