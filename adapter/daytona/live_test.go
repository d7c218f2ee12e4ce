package daytona_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona"
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
	key := os.Getenv("DAYTONA_API_KEY")
	if key == "" {
		t.Skip("DAYTONA_API_KEY is not set: the live Daytona smoke test is off (see docs/providers/daytona.md)")
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	c, err := daytona.New(daytona.Config{APIKey: daytona.NewSecret(key), APIURL: os.Getenv("DAYTONA_API_URL")})
	if err != nil {
		t.Fatal(err)
	}
	stop := 0
	cfg := daytona.AdapterConfig{Client: c, Snapshot: os.Getenv("DAYTONA_SNAPSHOT"), AutoStopInterval: &stop,
		Version: os.Getenv("DAYTONA_SHIM_VERSION"), Shim: "/usr/local/bin/runner-shim"}
	if cfg.Snapshot == "" {
		bin, err := os.ReadFile(shimBin)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Version, cfg.Shim = shimVersion, ".runner/runner-shim"
		cfg.ShimBinary = func() ([]byte, error) { return bin, nil }
	}
	a, err := daytona.NewAdapter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	name := "runner-smoke-" + strings.ToLower(time.Now().UTC().Format("20060102t150405"))
	h, err := a.Create(ctx, name, adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	defer func() {
		if err := a.Destroy(context.Background(), h); err != nil {
			t.Errorf("Destroy = %v", err)
		}
	}()
	r, err := a.Exec(ctx, h, adapter.Shell(`printf 'a\000b\001\001\001\377'; exit 3`))
	if err != nil || string(r.Stdout) != "a\x00b\x01\x01\x01\xff" || r.Exit.Code != 3 {
		t.Fatalf("Exec = %q %v %v", r.Stdout, r.Exit, err)
	}
	st, err := a.Spawn(ctx, h, adapter.Shell("echo ready; cat"), adapter.SpawnOptions{SessionID: "smoke"})
	if err != nil {
		t.Fatalf("Spawn = %v", err)
	}
	defer st.Close()
	if err := a.WriteStdin(ctx, h, "smoke", []byte("a\x00b\n")); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	if err := a.CloseStdin(ctx, h, "smoke"); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	var out []byte
	for f := range st.Frames() {
		if f.Err != nil {
			t.Fatalf("stream: %v", f.Err)
		}
		if f.Exit != nil {
			if !f.Exit.Success() {
				t.Fatalf("exit %v", f.Exit)
			}
			break
		}
		out = append(out, f.Data...)
	}
	if string(out) != "ready\na\x00b\n" {
		t.Fatalf("stdout %q", out)
	}
	re, err := a.Attach(ctx, h, "smoke", adapter.Cursor{Stdout: 6})
	if err != nil {
		t.Fatalf("Attach = %v", err)
	}
	defer re.Close()
	var tail []byte
	for f := range re.Frames() {
		if f.Terminal() {
			break
		}
		tail = append(tail, f.Data...)
	}
	if string(tail) != "a\x00b\n" {
		t.Fatalf("attach from 6: %q", tail)
	}
	list, err := a.Sessions(ctx, h)
	if err != nil || len(list) != 1 || list[0].ID != "smoke" || list[0].Stdout != 10 {
		t.Fatalf("Sessions = %+v %v", list, err)
	}
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
