package sprites_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// TestInstallWhateverTheMissingExit: how Sprites ends the exec of a
// program that does not exist is not documented, so an adopted sprite
// without runner-shim gets it installed whether that exec ends with 127,
// with 1 (a shell's message on stderr) or with no exit frame at all, and
// then runs commands. A runner-shim that still does not answer its
// version after the install (a binary that exits 1 with a message) is a
// provider error naming the path, and a sprite created for it is deleted.
func TestInstallWhateverTheMissingExit(t *testing.T) {
	notShim := filepath.Join(t.TempDir(), "not-runner-shim")
	if err := os.WriteFile(notShim, []byte("#!/bin/sh\necho \"sh: 1: runner-shim: not found\" >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		exit int
	}{{"127", 0}, {"1", 1}, {"no exit frame", -1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, c := standIn(t, spritestest.Options{MissingExit: tc.exit})
			ctx := ctxT(t)
			a := newAdapter(t, c, nil)
			if _, err := c.Create(ctx, sprites.CreateRequest{Name: "bare"}); err != nil {
				t.Fatal(err)
			}
			h, err := a.Create(ctx, "bare", adapter.CreateOptions{})
			if err != nil {
				t.Fatalf("Create adopting a sprite without runner-shim = %v", err)
			}
			dir, _ := srv.Dir("bare")
			if fi, err := os.Stat(filepath.Join(dir, sprites.DefaultShimPath)); err != nil || fi.Mode().Perm() != 0o755 {
				t.Fatalf("installed runner-shim: %v %v, want mode 0755", fi, err)
			}
			r, err := a.Exec(ctx, h, adapter.Shell("echo hi; exit 4"))
			if err != nil || string(r.Stdout) != "hi\n" || r.Exit.Code != 4 {
				t.Fatalf("Exec in the adopted sprite = %q %+v %v, want \"hi\\n\" and exit 4", r.Stdout, r.Exit, err)
			}

			bad := newAdapter(t, c, func(cfg *sprites.AdapterConfig) { cfg.ShimBinary = binary(notShim) })
			if _, err := c.Create(ctx, sprites.CreateRequest{Name: "bare2"}); err != nil {
				t.Fatal(err)
			}
			_, err = bad.Create(ctx, "bare2", adapter.CreateOptions{})
			var pe *adapter.ProviderError
			if !errors.As(err, &pe) || !strings.Contains(pe.Detail, sprites.DefaultShimPath) {
				t.Fatalf("Create adopting, with an installer whose runner-shim never answers = %v, want a provider error naming %s", err, sprites.DefaultShimPath)
			}
			_, err = bad.Create(ctx, "fresh", adapter.CreateOptions{})
			if !errors.As(err, &pe) || !strings.Contains(pe.Detail, sprites.DefaultShimPath) {
				t.Fatalf("Create with a runner-shim that never answers = %v, want a provider error naming %s", err, sprites.DefaultShimPath)
			}
			if _, err := a.Get(ctx, "fresh"); !errors.Is(err, adapter.ErrNotFound) {
				t.Fatalf("Get after the refused create = %v, want not_found (deleted)", err)
			}
		})
	}
}
