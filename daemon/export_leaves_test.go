package daemon

import "time"

// SetLeafSweepInterval sets how often a daemon started afterwards looks
// for ended sessions' leaves, until the returned function restores it.
func SetLeafSweepInterval(d time.Duration) (restore func()) {
	old := leafSweepInterval
	leafSweepInterval = d
	return func() { leafSweepInterval = old }
}
