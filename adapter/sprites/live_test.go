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
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/adapter/sprites"
)

// TestLiveSmoke drives real Sprites, off by default. Run it with a token:
//
//	SPRITES_TOKEN=... go test -run TestLiveSmoke -v ./adapter/sprites/
//
// SPRITES_API_URL overrides https://api.sprites.dev. It uploads the
// runner-shim TestMain builds (the host's GOARCH: run it on linux/amd64),
// creates one sprite named runner-smoke-<time>, and destroys it. Besides
// exits, stdin and attach it runs the four checks that matter first
// against the real service (issue 31): a loop of execs timed (no 5 s
// close stall), a session across 90 s of idleness (the task hold), a
// 200 KiB fast command byte-exact (lost or capped output), and the
// upload path (fs/write as the sprite user).
func TestLiveSmoke(t *testing.T) {
	token := shims.Live(t, "SPRITES_TOKEN", "Sprites", "docs/providers/sprites.md")
	if runtime.GOARCH != "amd64" {
		t.Skipf("the runner-shim built here is %s; Sprites runs linux/amd64", runtime.GOARCH)
	}
	c, err := sprites.New(sprites.Config{Token: sprites.NewSecret(token), BaseURL: os.Getenv("SPRITES_API_URL")})
	hostedtest.Check(t, err)
	a := hostedtest.Open(t, sprites.AdapterConfig{Client: c, Config: hosted.Config{Version: shimVersion, ShimBinary: binary(shims.Current)}}, nil, sprites.NewAdapter)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h, destroy := hostedtest.LiveSandbox(t, ctx, a)
	defer destroy()
	name := h.Name
	// 4. The upload path: Create uploaded runner-shim to DefaultShimPath
	// as the sprite user; say whether /usr/local/bin would have taken it.
	if _, err := c.WriteFile(ctx, name, "/usr/local/bin/runner-smoke-probe", []byte("x"), 0o644); err != nil {
		t.Logf("upload path: fs/write to /usr/local/bin refused (%v); %s took it", err, sprites.DefaultShimPath)
	} else {
		t.Logf("upload path: fs/write to /usr/local/bin accepted; %s took it too", sprites.DefaultShimPath)
	}
	// 1. A loop of execs, timed: each runner-shim call well under the
	// 5 s close hold.
	start := time.Now()
	for range 10 {
		if _, err := a.Sessions(ctx, h); err != nil {
			t.Fatalf("Sessions = %v", err)
		}
	}
	per := time.Since(start) / 10
	t.Logf("exec loop: %v per runner-shim call", per)
	if per > 3*time.Second {
		t.Errorf("exec loop: %v per call, want no 5 s close stall", per)
	}
	// 3. A 200 KiB fast command, byte-exact.
	big, err := a.Exec(ctx, h, adapter.Shell("head -c 204800 /dev/zero | tr '\\0' 'x'; echo err >&2"))
	if err != nil || len(big.Stdout) != 204800 || strings.Trim(string(big.Stdout), "x") != "" || string(big.Stderr) != "err\n" {
		t.Errorf("200 KiB exec: %d bytes of stdout, stderr %q, %v; want 204800 x and err", len(big.Stdout), big.Stderr, err)
	}
	// 2. A session across 90 s of idleness: detached, nothing of ours
	// attached, it must end with its true exit and every byte.
	idle, err := a.Spawn(ctx, h, adapter.Shell("echo before; sleep 90; echo after; exit 7"), adapter.SpawnOptions{SessionID: "idle"})
	if err != nil {
		t.Fatalf("Spawn idle = %v", err)
	}
	readUntil(t, idle, "before\n")
	idle.Close()
	time.Sleep(100 * time.Second)
	idle, err = a.Attach(ctx, h, "idle", adapter.Cursor{})
	if err != nil {
		t.Fatalf("Attach idle = %v", err)
	}
	if out, _, end := readAll(t, idle); string(out) != "before\nafter\n" || end.Exit == nil || end.Exit.Code != 7 {
		t.Errorf("session across idleness: %q, %+v; want before, after, exit 7", out, end)
	}
	idle.Close()
	for _, code := range []int{0, 3, 255} {
		r, err := a.Exec(ctx, h, adapter.Shell("echo hello; exit "+strconv.Itoa(code)))
		if err != nil || string(r.Stdout) != "hello\n" || r.Exit.Code != code {
			t.Fatalf("Exec(exit %d) = %q %v %v", code, r.Stdout, r.Exit, err)
		}
	}
	st, out, end := stdinSession(t, ctx, a, h, "smoke", "echo ready; cat", "a\x00b\n")
	defer st.Close()
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
	if err != nil || len(list) != 2 || list[1].ID != "smoke" || list[1].Stdout != 10 {
		t.Fatalf("Sessions = %+v %v", list, err)
	}
}
