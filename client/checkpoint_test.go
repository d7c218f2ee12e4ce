package client_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/internal/testcap"
)

// TestConformanceCheckpoint runs Capability/checkpoint against a runnerd
// with cgroups (the freezer), which advertises checkpoints. Its
// CorruptCheckpoint hook overwrites every stored chunk of the sandbox.
func TestConformanceCheckpoint(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "checkpoints need cgroups")
	}
	if _, err := os.Stat("/sys/fs/cgroup/freezer"); err != nil {
		if _, err2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err2 != nil {
			testcap.Skip(t, "cgroup freezer", err.Error())
		}
	}
	root := fmt.Sprintf("/runner-client-test-%d", os.Getpid())
	d := startDaemon(t, "--netpolicy", "off", "--cgroups", "auto", "--cgroup-root", root)
	t.Cleanup(func() {
		d.stop()
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + root)
		for _, dir := range dirs {
			os.Remove(dir) // the sandboxes' cgroups went with them
		}
	})
	var test conformance.Test
	for _, tc := range conformance.Tests() {
		if tc.Name == "Capability/checkpoint" {
			test = tc
		}
	}
	test.Func(t, conformance.Harness{
		New: func(t conformance.T) conformance.Subject {
			a := conformanceAdapter(t, d.url(), d.token)
			if !a.Capabilities().Has(adapter.CapCheckpoint) {
				t.Fatalf("capabilities %v: no checkpoint from a runnerd with cgroups", a.Capabilities())
			}
			return conformance.Subject{Adapter: a, CorruptCheckpoint: func(h adapter.Handle, id string) error {
				n := 0
				err := filepath.WalkDir(filepath.Join(d.state, "checkpoints", h.Name, "chunks"), func(p string, e fs.DirEntry, err error) error {
					if err != nil || e.IsDir() {
						return err
					}
					n++
					return os.WriteFile(p, []byte("not a zstd frame"), 0o600)
				})
				if err == nil && n == 0 {
					err = fmt.Errorf("no chunks stored for %s", h.Name)
				}
				return err
			}}
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  60 * time.Second,
	})
}
