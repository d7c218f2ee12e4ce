package sessions

import (
	"sync/atomic"
	"time"

	"github.com/agentrunner/runner/wire"
)

// tallies is Metrics as a test keeps it: counts, safe for concurrent use.
type tallies struct {
	started, collected, ended atomic.Int64
}

func (m *tallies) SessionStarted(time.Duration) { m.started.Add(1) }
func (m *tallies) SessionCollected()            { m.collected.Add(1) }
func (m *tallies) SessionEnded(*wire.Exit)      { m.ended.Add(1) }
