package sprites_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/sprites"
)

// TestLiveSmoke drives real Sprites, off by default. Run it with a token:
//
//	SPRITES_TOKEN=... go test -run TestLiveSmoke -v ./adapter/sprites/
//
// SPRITES_API_URL overrides https://api.sprites.dev. It uploads the
// runner-shim TestMain builds (the host's GOARCH: run it on linux/amd64),
// creates one sprite named runner-smoke-<time>, and destroys it.
func TestLiveSmoke(t *testing.T) {
	token := os.Getenv("SPRITES_TOKEN")
	if token == "" {
		t.Skip("SPRITES_TOKEN is not set: the live Sprites smoke test is off (see docs/providers/sprites.md)")
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	if runtime.GOARCH != "amd64" {
		t.Skipf("the runner-shim built here is %s; Sprites runs linux/amd64", runtime.GOARCH)
	}
	c, err := sprites.New(sprites.Config{Token: sprites.NewSecret(token), BaseURL: os.Getenv("SPRITES_API_URL")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := sprites.NewAdapter(sprites.AdapterConfig{Client: c, Version: shimVersion, ShimBinary: binary(shimBin)})
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
	for _, code := range []int{0, 3, 255} {
		r, err := a.Exec(ctx, h, adapter.Shell("echo hello; exit "+strconv.Itoa(code)))
		if err != nil || string(r.Stdout) != "hello\n" || r.Exit.Code != code {
			t.Fatalf("Exec(exit %d) = %q %v %v", code, r.Stdout, r.Exit, err)
		}
	}
	st, err := a.Spawn(ctx, h, adapter.Shell("echo ready; cat"), adapter.SpawnOptions{SessionID: "smoke"})
	if err != nil {
		t.Fatalf("Spawn = %v", err)
	}
	defer st.Close()
	readUntil(t, st, "ready\n")
	if err := a.WriteStdin(ctx, h, "smoke", []byte("a\x00b\n")); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	if err := a.CloseStdin(ctx, h, "smoke"); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	out, _, end := readAll(t, st)
	if string(out) != "a\x00b\n" || end.Exit == nil || !end.Exit.Success() {
		t.Fatalf("session: %q %v", out, end)
	}
	re, err := a.Attach(ctx, h, "smoke", adapter.Cursor{Stdout: 6})
	if err != nil {
		t.Fatalf("Attach = %v", err)
	}
	defer re.Close()
	if tail, _, _ := readAll(t, re); string(tail) != "a\x00b\n" {
		t.Fatalf("attach from 6: %q", tail)
	}
	list, err := a.Sessions(ctx, h)
	if err != nil || len(list) != 1 || list[0].ID != "smoke" || list[0].Stdout != 10 {
		t.Fatalf("Sessions = %+v %v", list, err)
	}
}
