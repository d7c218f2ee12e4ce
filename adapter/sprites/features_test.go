package sprites_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// TestCheckpointRestore is the checkpoint promise (issue 29): write
// files, checkpoint, change and delete them, restore, read the originals
// byte for byte; an unknown id is invalid, never not_found. The restore
// restarts the sprite (not ready for a while) and ends its sessions; the
// adapter returns once runner-shim answers again.
func TestCheckpointRestore(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{ReadyDelay: time.Second, CloseHold: -1})
	// The session killed by the restore is given up after this window.
	a := newAdapter(t, c, func(cfg *sprites.AdapterConfig) { cfg.ReattachWindow = 3 * time.Second })
	ctx := ctxT(t)
	h := hostedtest.Create(t, ctx, a, "ckpt")
	data := make([]byte, 200<<10)
	_, _ = rand.Read(data)
	const bin, txt = "/home/sprite/data.bin", "/home/sprite/notes.txt"
	for path, b := range map[string][]byte{bin: data, txt: []byte("one\n")} {
		if _, err := c.WriteFile(ctx, "ckpt", path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id, err := a.Checkpoint(ctx, h)
	if err != nil || id == "" {
		t.Fatalf("checkpoint: %q, %v", id, err)
	}
	if _, err := c.WriteFile(ctx, "ckpt", txt, []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Exec(ctx, h, adapter.Shell("rm home/sprite/data.bin && echo new > home/sprite/added")); err != nil || r.Exit.Code != 0 {
		t.Fatalf("change the files: %v, %v", r.Exit, err)
	}
	running, err := a.Spawn(ctx, h, adapter.Shell("echo started; sleep 60"), adapter.SpawnOptions{SessionID: "during"})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, running, "started")

	err = a.Restore(ctx, h, "v999")
	if adapter.KindOf(err) != adapter.KindInvalid || errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("restore of an unknown id: %v, want invalid", err)
	}
	if err := a.Restore(ctx, h, id); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got, err := c.ReadFile(ctx, "ckpt", bin); err != nil || !bytes.Equal(got, data) {
		t.Errorf("data.bin after restore: %d bytes, %v; want the %d checkpointed", len(got), err, len(data))
	}
	if got, err := c.ReadFile(ctx, "ckpt", txt); err != nil || string(got) != "one\n" {
		t.Errorf("notes.txt after restore: %q, %v; want one", got, err)
	}
	if _, err := c.ReadFile(ctx, "ckpt", "/home/sprite/added"); !errors.Is(err, sprites.ErrNoFile) {
		t.Errorf("a file made after the checkpoint: %v, want it gone", err)
	}
	// Every session ended with the restart: the one running is not
	// resumed (its stream never reports a made-up exit).
	_, _, end := readAll(t, running)
	if end.Exit != nil && end.Exit.Code == 0 {
		t.Errorf("the session running at the restore ended %+v, want no clean exit", end)
	}
	if r, err := a.Exec(ctx, h, adapter.Shell("cat home/sprite/notes.txt")); err != nil || string(r.Stdout) != "one\n" {
		t.Errorf("exec after restore: %q, %v", r.Stdout, err)
	}
	_ = srv
}

// TestPublicURL: one URL per sprite, reaching port 8080, made public with
// url_settings.auth; the URL is the API's. Other ports are invalid.
func TestPublicURL(t *testing.T) {
	srv, c := standIn(t, spritestest.Options{CloseHold: -1})
	a := newAdapter(t, c, nil)
	ctx := ctxT(t)
	h := hostedtest.Create(t, ctx, a, "web")
	if srv.URLAuth("web") != "sprite" {
		t.Fatalf("a new sprite's URL auth is %q, want sprite", srv.URLAuth("web"))
	}
	u, err := a.PublicURL(ctx, h, 8080)
	sp, gerr := c.Get(ctx, "web")
	if err != nil || gerr != nil || u != sp.URL || srv.URLAuth("web") != "public" {
		t.Errorf("public url: %q, %v; want the API's %q with auth public (now %q)", u, err, sp.URL, srv.URLAuth("web"))
	}
	for _, port := range []int{8081, 0, 65536} {
		if _, err := a.PublicURL(ctx, h, port); adapter.KindOf(err) != adapter.KindInvalid {
			t.Errorf("public url of port %d: %v, want invalid", port, err)
		}
	}
}
