package move

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/agentrunner/runner/adapter"
)

// Archive parks sandbox name, archives it into the bucket and removes it
// from its runner: it then lives only in the bucket (its route record
// names no runner; the pool answers its calls *adapter.UnavailableError)
// until Restore puts it on a runner. A session still running is a
// conflict (*adapter.InvalidError) and changes nothing; another mover's
// lease is a *LeaseHeldError. The archive objects stay until Restore.
func (m *Mover) Archive(ctx context.Context, name string) error {
	if err := m.syncRoute(ctx, name); err != nil {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	from, ok := m.pool.RunnerOf(name)
	switch {
	case !ok:
		return &adapter.InvalidError{Detail: fmt.Sprintf("archive: sandbox name %q carries no route of this fleet", name)}
	case from == "":
		return &adapter.InvalidError{Detail: fmt.Sprintf("archive: sandbox %s is archived already", name)}
	}
	src, err := m.pool.Client(from)
	if err != nil {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	release, err := m.lease(ctx, name, from, "bucket")
	if err != nil {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	defer release()
	if now, _ := m.pool.RunnerOf(name); now != from {
		return &adapter.InvalidError{Detail: fmt.Sprintf("archive: sandbox %s moved to %q meanwhile", name, now)}
	}
	done, err := m.pool.Moving(name)
	if err != nil {
		return fmt.Errorf("archive %s: %w", name, err)
	}
	defer done()
	start := time.Now()
	man, err := m.archive(ctx, src, from, name)
	if err != nil {
		m.removeArchive(ctx, name)
		return fmt.Errorf("archive %s on %s: %w", name, from, err)
	}
	// The bucket is the sandbox from here: its route says so first, then
	// the runner's copy goes.
	if _, err := m.store.putJSON(ctx, m.store.key("routes", name), Route{Sandbox: name, Runner: "", Moved: time.Now().UTC()}, minio.PutObjectOptions{}); err != nil {
		m.removeArchive(ctx, name)
		return fmt.Errorf("archive %s: record route: %w", name, err)
	}
	m.pool.SetRoute(name, "")
	if err := src.DeleteSandbox(ctx, name); err != nil {
		return fmt.Errorf("archive %s: archived, but removing the copy on %s failed: %w", name, from, err)
	}
	m.log.Info("archive: done", "sandbox", name, "from", from, "checkpoint_bytes", man.CheckpointBytes, "sessions_bytes", man.SessionsBytes, "took", time.Since(start))
	return nil
}

// Restore puts archived sandbox name on runner to ("" lets placement
// pick), parked, exactly as Move's target receives it, and returns the
// runner. A sandbox that is not archived, or a target that has the name
// already, is *adapter.InvalidError; another mover's lease a
// *LeaseHeldError. The archive objects are removed once the route names
// the target (unless Options.KeepArchive).
func (m *Mover) Restore(ctx context.Context, name, to string) (string, error) {
	if err := m.syncRoute(ctx, name); err != nil {
		return "", fmt.Errorf("restore %s: %w", name, err)
	}
	if at, ok := m.pool.RunnerOf(name); !ok || at != "" {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("restore: sandbox %s is not archived (on %q)", name, at)}
	}
	if to == "" {
		var err error
		if to, err = m.pool.Pick(ctx); err != nil {
			return "", fmt.Errorf("restore %s: pick a runner: %w", name, err)
		}
	}
	dst, err := m.pool.Client(to)
	if err != nil {
		return "", fmt.Errorf("restore %s: %w", name, err)
	}
	release, err := m.lease(ctx, name, "bucket", to)
	if err != nil {
		return "", fmt.Errorf("restore %s: %w", name, err)
	}
	defer release()
	if at, _ := m.pool.RunnerOf(name); at != "" {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("restore: sandbox %s was restored to %s meanwhile", name, at)}
	}
	done, err := m.pool.Moving(name)
	if err != nil {
		return "", fmt.Errorf("restore %s: %w", name, err)
	}
	defer done()
	var man Manifest
	if _, err := m.store.getJSON(ctx, m.objKey(name, "manifest.json"), &man); err != nil {
		if errors.Is(err, errNoObject) {
			return "", &adapter.ProviderError{Provider: "s3", Detail: fmt.Sprintf("restore: sandbox %s is archived but its manifest is missing", name)}
		}
		return "", fmt.Errorf("restore %s: read manifest: %w", name, err)
	}
	if man.Version != ManifestVersion || man.Sandbox != name {
		return "", &adapter.InvalidError{Detail: fmt.Sprintf("restore: manifest of %s: version %d, sandbox %q", name, man.Version, man.Sandbox)}
	}
	if err := m.restore(ctx, dst, man); err != nil {
		if errors.Is(err, errTargetHolds) {
			return "", &adapter.InvalidError{Detail: fmt.Sprintf("restore: runner %s holds a sandbox %s already", to, name)}
		}
		if derr := dst.DeleteSandbox(context.WithoutCancel(ctx), name); derr != nil {
			m.log.Warn("restore: remove the target's partial copy", "sandbox", name, "to", to, "err", derr)
		}
		return "", fmt.Errorf("restore %s to %s: %w", name, to, err)
	}
	if _, err := m.store.putJSON(ctx, m.store.key("routes", name), Route{Sandbox: name, Runner: to, Moved: time.Now().UTC()}, minio.PutObjectOptions{}); err != nil {
		if derr := dst.DeleteSandbox(context.WithoutCancel(ctx), name); derr != nil {
			m.log.Warn("restore: remove the target's copy", "sandbox", name, "to", to, "err", derr)
		}
		return "", fmt.Errorf("restore %s: record route: %w", name, err)
	}
	m.pool.SetRoute(name, to)
	if !m.opts.KeepArchive {
		m.removeArchive(ctx, name)
	}
	m.log.Info("restore: done", "sandbox", name, "to", to)
	return to, nil
}

// lease takes name's lease and reads its route again under it (no other
// mover writes the route while it is held), and returns the release.
func (m *Mover) lease(ctx context.Context, name, from, to string) (func(), error) {
	l, err := m.store.Acquire(ctx, Lease{Sandbox: name, Holder: m.opts.Holder, From: from, To: to}, m.opts.LeaseTTL)
	if err != nil {
		return nil, fmt.Errorf("take lease: %w", err)
	}
	release := func() {
		if err := m.store.Release(context.WithoutCancel(ctx), l); err != nil {
			m.log.Warn("release lease", "sandbox", name, "err", err)
		}
	}
	if err := m.syncRoute(ctx, name); err != nil {
		release()
		return nil, err
	}
	return release, nil
}
