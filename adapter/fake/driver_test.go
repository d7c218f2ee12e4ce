package fake

import (
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
)

// TestDriverConformance runs the suite on the bare in-memory driver
// through conformance.OverDriver: how a new provider's driver plugs in,
// in a few lines (go-cloud's drivertest with its in-memory driver).
func TestDriverConformance(t *testing.T) {
	for _, name := range []string{"all", "none"} {
		t.Run(name, func(t *testing.T) {
			conformance.Run(t, conformance.Harness{
				New: func(t conformance.T) conformance.Subject {
					var opts []Option
					if name == "none" {
						opts = append(opts, WithCapabilities())
					}
					d := New(opts...).d
					t.Cleanup(func() { _ = d.Close() })
					return conformance.OverDriver(d, adapter.Options{}, conformance.Subject{Outage: d.Outage,
						InterruptList: d.InterruptNextList, CorruptCheckpoint: d.CorruptCheckpoint})
				},
				Fixtures: driverFixtures(),
				Timeout:  10 * time.Second,
			})
		})
	}
}

func driverFixtures() conformance.Fixtures {
	fx := conformance.ShellFixtures()
	fx.Probe = func(host string) adapter.Command { return adapter.Command{Path: "probe", Args: []string{host}} }
	fx.ProbeHost = "allowed.example"
	return fx
}
