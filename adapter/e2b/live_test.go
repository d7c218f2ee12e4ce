package e2b_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

// TestLiveSmoke drives real E2B, off by default. Run it with an account:
//
//	E2B_API_KEY=e2b_... go test -run TestLiveSmoke -v ./adapter/e2b/
//
// E2B_TEMPLATE names a template with runner-shim at /usr/local/bin
// (images/e2b) built with E2B_SHIM_VERSION; without E2B_TEMPLATE it uses
// E2B's "base" template and installs the runner-shim this test builds
// through envd's files API. It creates one sandbox and destroys it.
func TestLiveSmoke(t *testing.T) {
	key := shims.Live(t, "E2B_API_KEY", "E2B", "docs/providers/e2b.md")
	c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret(key), Domain: os.Getenv("E2B_DOMAIN")})
	hostedtest.Check(t, err)
	cfg := e2b.AdapterConfig{Client: c, Template: os.Getenv("E2B_TEMPLATE"), Timeout: 300, Config: hosted.Config{Version: os.Getenv("E2B_SHIM_VERSION"), Shim: "/usr/local/bin/runner-shim"}}
	if cfg.Template == "" {
		cfg.Template, cfg.Version, cfg.Shim = "base", shimVersion, "./.runner/runner-shim"
		cfg.ShimBinary = shims.Binary(t)
	}
	a := hostedtest.Open(t, cfg, nil, e2b.NewAdapter)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, destroy := hostedtest.LiveSandbox(t, ctx, a)
	defer destroy()
	r, err := a.Exec(ctx, h, adapter.Shell("echo hello; exit 3"))
	if err != nil || string(r.Stdout) != "hello\n" || r.Exit.Code != 3 {
		t.Fatalf("Exec = %q %v %v", r.Stdout, r.Exit, err)
	}
	hostedtest.LiveSession(t, ctx, a, h)
}
