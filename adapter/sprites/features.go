package sprites

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"

	"github.com/agentrunner/runner/adapter"
)

// The optional calls Sprites delivers are its driver's: the portable
// adapter has checked the capability, the handle and the port range.
var (
	_ adapter.PublicURLer  = driver{}
	_ adapter.Checkpointer = driver{}
)

// PublicPort is the one port a sprite's URL reaches
// (https://<name>-<org>.sprites.app routes to port 8080, or to the first
// HTTP port the sprite opens: working-with-sprites, "HTTP Access").
const PublicPort = 8080

// PublicURL makes the sprite's URL public and returns it, for port 8080
// only (any other port is *adapter.InvalidError: the sprite has one URL).
// The URL is the one the API reports, never built from the name. Making
// it public opens the WHOLE sprite's URL to anyone who has it, for as
// long as the sprite lives (url_settings.auth = "public"); the URL is
// derived from the sprite's and the organization's names, so it is not
// a secret.
func (d driver) PublicURL(ctx context.Context, h adapter.Handle, port int) (string, error) {
	a := d.a
	if port != PublicPort {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("a sprite's URL reaches port %d only, not %d", PublicPort, port)}
	}
	if _, err := a.Guest(ctx, h); err != nil {
		return "", err
	}
	sp, err := a.cfg.Client.SetURLAuth(ctx, h.Name, "public")
	if err != nil {
		return "", fmt.Errorf("public url of %s: %w", h.Name, err)
	}
	if sp.ID != "" && sp.ID != h.ID {
		return "", fmt.Errorf("sprite %s is now %s, not %s: %w", h.Name, sp.ID, h.ID, adapter.ErrNotFound)
	}
	u, perr := url.Parse(sp.URL)
	if perr != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return "", &adapter.ProviderError{Provider: provider, Detail: fmt.Sprintf("public url of %s: the API reported no usable URL", h.Name)}
	}
	if sp.URLSettings == nil || sp.URLSettings.Auth != "public" {
		return "", &adapter.ProviderError{Provider: provider, Detail: fmt.Sprintf("public url of %s: the API did not report the URL public", h.Name)}
	}
	return sp.URL, nil
}

// Checkpoint snapshots the sprite's writable filesystem (POST
// …/checkpoint) and returns the checkpoint's id. The progress stream
// names the id only in free text, so the checkpoint is given a unique
// comment and found by it in the listing; a stream cut midway is settled
// the same way (listed: it exists).
func (d driver) Checkpoint(ctx context.Context, h adapter.Handle) (string, error) {
	a := d.a
	if _, err := a.Guest(ctx, h); err != nil {
		return "", err
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	comment := "runner-" + hex.EncodeToString(b)
	serr := a.cfg.Client.CreateCheckpoint(ctx, h.Name, comment)
	if serr != nil && !errors.Is(serr, adapter.ErrUnavailable) {
		return "", fmt.Errorf("checkpoint %s: %w", h.Name, serr)
	}
	cps, err := a.cfg.Client.ListCheckpoints(ctx, h.Name)
	if err != nil {
		return "", fmt.Errorf("checkpoint %s: find it: %w", h.Name, err)
	}
	for _, cp := range cps {
		if cp.Comment == comment && cp.ID != "" {
			return cp.ID, nil
		}
	}
	if serr != nil {
		return "", fmt.Errorf("checkpoint %s: %w", h.Name, serr)
	}
	return "", &adapter.ProviderError{Provider: provider, Detail: "checkpoint " + h.Name + ": the checkpoint is not listed after its stream ended"}
}

// Restore replaces the sprite's writable filesystem with checkpoint id
// and returns once the sprite takes execs again with the right
// runner-shim. An unknown id is *adapter.InvalidError. Sprites restarts
// the sprite: every session ends, and runner-shim's session root is the
// checkpoint's (sessions started after the checkpoint are gone from it;
// those running at the checkpoint are lost, not resumed).
func (d driver) Restore(ctx context.Context, h adapter.Handle, id string) error {
	a := d.a
	if id == "" {
		return &adapter.InvalidError{Detail: "empty checkpoint id"}
	}
	if _, err := a.Guest(ctx, h); err != nil {
		return err
	}
	if _, err := a.cfg.Client.GetCheckpoint(ctx, h.Name, id); err != nil {
		return fmt.Errorf("restore %s: %w", h.Name, err)
	}
	if err := a.cfg.Client.RestoreCheckpoint(ctx, h.Name, id); err != nil {
		if errors.Is(err, adapter.ErrProvider) {
			return &adapter.RestoreFailedError{Detail: fmt.Sprintf("%s to %s: %v", h.Name, id, err)}
		}
		return fmt.Errorf("restore %s: %w", h.Name, err)
	}
	// The restored disk may hold another runner-shim (or none): verify it
	// afresh, on a new transport, once the sprite is back.
	if err := a.Renew(ctx, h, a.transport(h)); err != nil {
		return fmt.Errorf("restore %s: the sprite did not come back: %w", h.Name, err)
	}
	return nil
}
