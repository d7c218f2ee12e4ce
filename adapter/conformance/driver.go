package conformance

import (
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// The driver entry, go-cloud's drivertest: a new provider writes an
// adapter.Driver (plus the optional interfaces it delivers), an error
// table and a stand-in, and its whole contract test is one RunDriver
// call. The suite then runs through the portable adapter.Sandboxes, so
// what the portable type checks once (names, handles, capability gates,
// options) is checked for that driver too.

// DriverSubject is one fresh driver under test, with its fault hooks
// (see [Subject] for each hook's meaning).
type DriverSubject struct {
	// Driver is the driver under test. The harness releases it (with
	// t.Cleanup) when the subtest ends.
	Driver            adapter.Driver
	Outage            func() (restore func())
	InterruptList     func()
	CorruptCheckpoint func(h adapter.Handle, id string) error
}

// DriverHarness describes a driver to the suite: New makes a fresh
// DriverSubject for every subtest, which the suite drives as
// adapter.New(Driver, Options).
type DriverHarness struct {
	New      func(t T) DriverSubject
	Options  adapter.Options
	Fixtures Fixtures
	NewName  func(t T) string
	Timeout  time.Duration
}

// ForDriver returns the Harness that runs the suite on adapter.New over
// each subject's driver.
func ForDriver(h DriverHarness) Harness {
	return Harness{
		New: func(t T) Subject {
			s := h.New(t)
			if s.Driver == nil {
				t.Fatalf("DriverHarness.New returned no driver")
			}
			return Subject{Adapter: adapter.New(s.Driver, h.Options), Outage: s.Outage,
				InterruptList: s.InterruptList, CorruptCheckpoint: s.CorruptCheckpoint}
		},
		Fixtures: h.Fixtures,
		NewName:  h.NewName,
		Timeout:  h.Timeout,
	}
}

// RunDriver runs every subtest of [Tests] against the portable adapter
// over h's drivers.
func RunDriver(t *testing.T, h DriverHarness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("conformance: DriverHarness.New is nil")
	}
	Run(t, ForDriver(h))
}
