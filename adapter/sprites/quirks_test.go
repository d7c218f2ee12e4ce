package sprites_test

import (
	"errors"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// TestWriteFileAsSpriteUser: fs/write has no asRoot flag, so it writes
// as the sprite user; a system directory is refused with 403, which is
// the path's fault (provider, ErrWriteDenied), not a bad token (denied).
// The 16 MiB limit is refused before anything is sent.
func TestWriteFileAsSpriteUser(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	ctx := ctxFor(t)
	mustCreate(t, f, "perm")
	_, err := f.c.WriteFile(ctx, "perm", "/usr/local/bin/runner-shim", []byte("x"), 0o755)
	wantKind(t, "write /usr/local/bin", err, adapter.KindProvider)
	if !errors.Is(err, sprites.ErrWriteDenied) {
		t.Errorf("write /usr/local/bin: got %v, want ErrWriteDenied", err)
	}
	if _, err := f.c.WriteFile(ctx, "perm", sprites.DefaultShimPath, []byte("x"), 0o755); err != nil {
		t.Errorf("write %s: %v", sprites.DefaultShimPath, err)
	}
	before := f.srv.Requests("PUT /v1/sprites/perm/fs/write")
	_, err = f.c.WriteFile(ctx, "perm", "/tmp/big", make([]byte, sprites.MaxWriteFile+1), 0o644)
	wantKind(t, "write 16 MiB + 1", err, adapter.KindInvalid)
	if got := f.srv.Requests("PUT /v1/sprites/perm/fs/write"); got != before {
		t.Errorf("an oversized write was sent (%d requests, want %d)", got, before)
	}
	if _, err := f.c.WriteFile(ctx, "perm", "/tmp/max", make([]byte, sprites.MaxWriteFile), 0o644); err != nil {
		t.Errorf("write of exactly 16 MiB: %v", err)
	}
}

// TestPageSize500: the API takes max_results up to 500 (openapi
// v0.1.12), so a listing of 120 sprites is one page.
func TestPageSize500(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	ctx := ctxFor(t)
	for i := range 120 {
		mustCreate(t, f, "p-"+string(rune('a'+i/26))+string(rune('a'+i%26)))
	}
	p, err := f.c.List(ctx, sprites.ListOptions{MaxResults: 500})
	if err != nil || len(p.Sprites) != 120 || p.NextToken != "" {
		t.Fatalf("list 500: %d sprites, next %q, %v; want 120 in one page", len(p.Sprites), p.NextToken, err)
	}
	a := newAdapter(t, f.c, nil)
	page, err := a.List(ctx, adapter.ListOptions{PageSize: 500})
	if err != nil || len(page.Handles) != 120 || page.NextPageToken != "" {
		t.Errorf("adapter list 500: %d handles, next %q, %v; want 120 in one page", len(page.Handles), page.NextPageToken, err)
	}
}

// TestPings: an exec WebSocket is pinged every PingInterval (the SDK's
// 15 s keepalive), here shortened.
func TestPings(t *testing.T) {
	srv, _ := standIn(t, spritestest.Options{})
	c, err := sprites.New(sprites.Config{Token: sprites.NewSecret(srv.Token), BaseURL: srv.URL(), PingInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := c.Create(ctx, sprites.CreateRequest{Name: "ping"}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Run(ctx, "ping", sprites.ExecOptions{Argv: []string{"sleep", "1"}}, nil)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("run: %d, %v", r.ExitCode, err)
	}
	if n := srv.Pings(); n < 5 {
		t.Errorf("the stand-in saw %d pings in a 1 s exec, want about 10", n)
	}
}
