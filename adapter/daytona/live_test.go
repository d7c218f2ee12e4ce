package daytona_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

// TestLiveSmoke drives real Daytona, off by default. Run it with an
// account:
//
//	DAYTONA_API_KEY=dtn_... go test -run TestLiveSmoke -v ./adapter/daytona/
//
// DAYTONA_API_URL overrides https://app.daytona.io/api. DAYTONA_SNAPSHOT
// names a snapshot with runner-shim at /usr/local/bin (images/daytona)
// built with DAYTONA_SHIM_VERSION; without DAYTONA_SNAPSHOT it uses the
// organization's default snapshot and uploads the runner-shim this test
// builds (the adapter's install path). It creates one sandbox and
// destroys it.
func TestLiveSmoke(t *testing.T) {
	key := shims.Live(t, "DAYTONA_API_KEY", "Daytona", "docs/providers/daytona.md")
	c, err := daytona.New(daytona.Config{APIKey: daytona.NewSecret(key), APIURL: os.Getenv("DAYTONA_API_URL")})
	hostedtest.Check(t, err)
	stop := 0
	cfg := daytona.AdapterConfig{Client: c, Snapshot: os.Getenv("DAYTONA_SNAPSHOT"), AutoStopInterval: &stop, Config: hosted.Config{Version: os.Getenv("DAYTONA_SHIM_VERSION"), Shim: "/usr/local/bin/runner-shim"}}
	if cfg.Snapshot == "" {
		cfg.Version, cfg.Shim = shimVersion, ".runner/runner-shim"
		cfg.ShimBinary = shims.Binary(t)
	}
	a := hostedtest.Open(t, cfg, nil, daytona.NewAdapter)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, destroy := hostedtest.LiveSandbox(t, ctx, a)
	defer destroy()
	r, err := a.Exec(ctx, h, adapter.Shell(`printf 'a\000b\001\001\001\377'; exit 3`))
	if err != nil || string(r.Stdout) != "a\x00b\x01\x01\x01\xff" || r.Exit.Code != 3 {
		t.Fatalf("Exec = %q %v %v", r.Stdout, r.Exit, err)
	}
	hostedtest.LiveSession(t, ctx, a, h)
	if err := a.Suspend(ctx, h); err != nil {
		t.Fatalf("Suspend = %v", err)
	}
	if err := a.Resume(ctx, h); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	if r, err := a.Exec(ctx, h, adapter.Shell("echo back")); err != nil || string(r.Stdout) != "back\n" {
		t.Fatalf("Exec after resume = %q %v", r.Stdout, err)
	}
}
