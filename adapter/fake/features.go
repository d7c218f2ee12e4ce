package fake

// The optional capabilities: suspend and resume, checkpoints (and the
// corruption hook the conformance suite uses), network policy and
// public URLs.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"

	"github.com/agentrunner/runner/adapter"
)

// Suspend kills the sandbox's commands (ReasonTerminated, SIGKILL) and
// parks it with its files.
func (a *driver) Suspend(ctx context.Context, h adapter.Handle) error {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return err
	}
	sb.suspended = true
	dones := sb.stopAll(false)
	a.mu.Unlock()
	return waitAll(ctx, dones)
}

// Resume unparks the sandbox with the same files.
func (a *driver) Resume(ctx context.Context, h adapter.Handle) error {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return err
	}
	sb.suspended = false
	a.mu.Unlock()
	return nil
}

// Checkpoint copies the sandbox's files.
func (a *driver) Checkpoint(ctx context.Context, h adapter.Handle) (string, error) {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return "", err
	}
	defer a.mu.Unlock()
	id := a.next("ckpt-")
	sb.checkpoints[id] = cloneFiles(sb.files)
	return id, nil
}

// Restore replaces the sandbox's files with a checkpoint's.
func (a *driver) Restore(ctx context.Context, h adapter.Handle, id string) error {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	files, ok := sb.checkpoints[id]
	if !ok {
		return &adapter.InvalidError{Detail: "unknown checkpoint " + id}
	}
	if files == nil {
		return &adapter.RestoreFailedError{Detail: "checkpoint " + id + " is corrupted"}
	}
	sb.files = cloneFiles(files)
	return nil
}

// CorruptCheckpoint is Adapter.CorruptCheckpoint.
func (a *driver) CorruptCheckpoint(h adapter.Handle, id string) error {
	sb, err := a.lockSandbox(context.Background(), h)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	if _, ok := sb.checkpoints[id]; !ok {
		return &adapter.InvalidError{Detail: "unknown checkpoint " + id}
	}
	sb.checkpoints[id] = nil
	return nil
}

func cloneFiles(m map[string][]byte) map[string][]byte {
	c := make(map[string][]byte, len(m))
	for k, v := range m {
		c[k] = slices.Clone(v)
	}
	return c
}

// SetNetworkPolicy replaces the egress allowlist, which the probe builtin
// obeys.
func (a *driver) SetNetworkPolicy(ctx context.Context, h adapter.Handle, p adapter.NetworkPolicy) error {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	sb.policy = &adapter.NetworkPolicy{Allow: slices.Clone(p.Allow)}
	return nil
}

// PublicURL returns an unguessable https URL for port, the same one on
// every call for one sandbox and port. Nothing serves it.
func (a *driver) PublicURL(ctx context.Context, h adapter.Handle, port int) (string, error) {
	sb, err := a.lockSandbox(ctx, h)
	if err != nil {
		return "", err
	}
	defer a.mu.Unlock()
	if u, ok := sb.urls[port]; ok {
		return u, nil
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	u := "https://" + hex.EncodeToString(b) + ".preview.fake.invalid/"
	sb.urls[port] = u
	return u, nil
}

// allowed reports whether the sandbox's policy lets host out; a.mu held.
func (sb *sandbox) allowed(host string) bool {
	return sb.policy == nil || slices.Contains(sb.policy.Allow, host)
}

// privateData is what the fake keeps in Handle.Private: a stand-in for the
// credential a real provider's handle carries, which must never be printed.
type privateData struct{ Token string }
