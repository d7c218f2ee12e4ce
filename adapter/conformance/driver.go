package conformance

import "github.com/agentrunner/runner/adapter"

// OverDriver is the driver entry, go-cloud's drivertest: a new provider
// writes an adapter.Driver (plus the optional interfaces it delivers), an
// error table and a stand-in, and its Harness.New returns
// OverDriver(driver, opts, hooks). The suite then runs through the
// portable adapter.Sandboxes, so what the portable type checks once
// (names, handles, capability gates, options) is checked for that driver
// too. hooks carries the fault hooks; its Adapter is replaced.
func OverDriver(d adapter.Driver, opts adapter.Options, hooks Subject) Subject {
	hooks.Adapter = adapter.New(d, opts)
	return hooks
}
