package client_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/internal/testcap"
)

// TestConformanceFork runs Capability/fork against a runnerd with cgroups
// (the freezer), which advertises checkpoints and forks.
func TestConformanceFork(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "forks need checkpoints, which need cgroups")
	}
	if _, err := os.Stat("/sys/fs/cgroup/freezer"); err != nil {
		if _, err2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err2 != nil {
			testcap.Skip(t, "cgroup freezer", err.Error())
		}
	}
	root := fmt.Sprintf("/runner-client-fork-test-%d", os.Getpid())
	d := startDaemon(t, "--netpolicy", "off", "--cgroups", "auto", "--cgroup-root", root)
	t.Cleanup(func() {
		d.stop()
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + root)
		for _, dir := range dirs {
			os.Remove(dir)
		}
	})
	var test conformance.Test
	for _, tc := range conformance.Tests() {
		if tc.Name == "Capability/fork" {
			test = tc
		}
	}
	test.Func(t, conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			a := conformanceAdapter(t, d.url(), d.token)
			if !a.Capabilities().Has(adapter.CapFork) {
				t.Fatalf("capabilities %v: no fork from a runnerd with cgroups", a.Capabilities())
			}
			return conformance.Subject{Adapter: a}
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  60 * time.Second,
	})
}
