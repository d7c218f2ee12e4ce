package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/client"
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

// TestPoolDoesNotAdvertiseFork: two runnerds that fork each (cgroups) do
// not make a pool that advertises fork, whose new names may route to
// another runner than the source's; the pool's Fork is then
// not_supported, and one runner alone advertises it.
func TestPoolDoesNotAdvertiseFork(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "forks need checkpoints, which need cgroups")
	}
	var ds []*daemon
	for i := range 2 {
		root := fmt.Sprintf("/runner-client-forkpool-%d-%d", os.Getpid(), i)
		d := startDaemon(t, "--netpolicy", "off", "--cgroups", "auto", "--cgroup-root", root)
		t.Cleanup(func() {
			d.stop()
			dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + root)
			for _, dir := range dirs {
				os.Remove(dir)
			}
		})
		ds = append(ds, d)
	}
	one := conformanceAdapter(t, ds[0].url(), ds[0].token)
	if !one.Capabilities().Has(adapter.CapFork) {
		testcap.Skip(t, "cgroup freezer", fmt.Sprintf("a runnerd with cgroups advertises %v", one.Capabilities()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := client.NewPool(ctx, []client.Endpoint{
		{Name: "r1", URL: ds[0].url(), Token: ds[0].token},
		{Name: "r2", URL: ds[1].url(), Token: ds[1].token},
	}, client.AdapterOptions{Client: conformanceOptions})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if pool.Capabilities().Has(adapter.CapFork) {
		t.Errorf("a pool advertises %s: %v", adapter.CapFork, pool.Capabilities())
	}
	src, err := pool.Create(ctx, "r1-src", adapter.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Destroy(context.Background(), src)
	if _, err := pool.Fork(ctx, src, "", "r2-dst", adapter.CreateOptions{}); !errors.Is(err, adapter.ErrNotSupported) {
		t.Errorf("pool Fork = %v, want not supported", err)
	}
}
