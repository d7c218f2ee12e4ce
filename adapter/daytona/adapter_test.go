package daytona_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/conformance"
	"github.com/agentrunner/runner/adapter/daytona"
	"github.com/agentrunner/runner/adapter/daytona/daytonatest"
)

const shimVersion = "v0.0.0-daytona-test"

// The runner-shim binaries the stand-in's "snapshot" carries, built once
// by TestMain from ./cmd/runner-shim.
var (
	shimBin, oldShimBin string
	buildErr            error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dtbin")
	if err != nil {
		panic(err)
	}
	shimBin, oldShimBin = filepath.Join(dir, "runner-shim"), filepath.Join(dir, "runner-shim-old")
	for bin, v := range map[string]string{shimBin: shimVersion, oldShimBin: "v0.0.0-old"} {
		cmd := exec.Command("go", "build", "-ldflags", "-X github.com/agentrunner/runner/version.Version="+v,
			"-o", bin, "github.com/agentrunner/runner/cmd/runner-shim")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/runner-shim: %v\n%s", err, out)
			break
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// standIn starts a Daytona stand-in whose sandboxes live in a short
// directory (runner-shim's socket paths must fit), and a client for it.
func standIn(t testing.TB) (*daytonatest.Server, *daytona.Client) {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	dir, err := os.MkdirTemp("", "dt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv := daytonatest.New(t, daytonatest.Options{Dir: dir})
	c, err := daytona.New(daytona.Config{APIKey: daytona.NewSecret(srv.APIKey), APIURL: srv.URL(), PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func newAdapter(t testing.TB, c *daytona.Client, mod func(*daytona.AdapterConfig)) *daytona.Adapter {
	t.Helper()
	cfg := daytona.AdapterConfig{Client: c, Version: shimVersion, Shim: shimBin,
		Lease: 3 * time.Second, ReattachWindow: 20 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	a, err := daytona.NewAdapter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestConformance runs the provider-neutral suite against the adapter
// and the stand-in, every command through the real runner-shim.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Harness{
		New: func(ct conformance.T) conformance.Subject {
			tb := ct.(testing.TB)
			srv, c := standIn(tb)
			return conformance.Subject{
				Adapter: newAdapter(tb, c, nil),
				Outage: func() func() {
					// The API answers 503; the toolbox proxy drops every
					// connection.
					srv.SetOutage(true)
					srv.SetDropConnections(true)
					return func() { srv.SetOutage(false); srv.SetDropConnections(false) }
				},
				InterruptList: func() { srv.InterruptList(1) },
			}
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  90 * time.Second,
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var _ = errors.Is
var _ = strings.Contains
var _ adapter.Handle
