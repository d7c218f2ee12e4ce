package daemon

import "time"

// SetShimStartTimeout sets the bound of a spawn's shim start until the
// returned function restores it.
func SetShimStartTimeout(d time.Duration) (restore func()) {
	old := shimStartTimeout
	shimStartTimeout = d
	return func() { shimStartTimeout = old }
}

// SetNetNSCheck replaces the spawn's network namespace check until the
// returned function restores it.
func SetNetNSCheck(f func(pid int, path string) (bool, error)) (restore func()) {
	old := netNSCheck
	netNSCheck = f
	return func() { netNSCheck = old }
}

// MetricsAddr is metricsAddr, for the tests of Config.MetricsListen.
var MetricsAddr = metricsAddr
