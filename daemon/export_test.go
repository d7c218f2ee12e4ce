package daemon

import "time"

// SetShimStartTimeout sets the bound of a spawn's shim start until the
// returned function restores it.
func SetShimStartTimeout(d time.Duration) (restore func()) {
	old := shimStartTimeout
	shimStartTimeout = d
	return func() { shimStartTimeout = old }
}

// MetricsAddr is metricsAddr, for the tests of Config.MetricsListen.
var MetricsAddr = metricsAddr
