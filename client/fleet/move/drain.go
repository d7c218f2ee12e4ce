package move

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/agentrunner/runner/wire"
)

// Draining lists the runners whose parked sandboxes are to move: for
// Kubernetes, the runners of cordoned nodes annotated
// runner.dev/drain=move (k8s.DrainAnnotation; k8s.Kubernetes.Draining).
type Draining interface {
	Draining(ctx context.Context) ([]string, error)
}

// DrainReport says what one drain of a runner did.
type DrainReport struct {
	Runner string
	// Moved maps each sandbox moved to the runner it went to.
	Moved map[string]string
	// Removed are copies left on the runner by a move that finished
	// elsewhere (their route names another runner), now destroyed.
	Removed []string
	// Running are sandboxes not parked (running, or with a session
	// running): left where they are, for the operator to park or end.
	Running []string
	// Failed maps each sandbox that could not move to why.
	Failed map[string]error
}

// Drain moves every parked sandbox of runner to another runner the pool
// picks, removes copies of sandboxes already moved elsewhere, and leaves
// running ones (reported). It goes on past a sandbox that fails; the
// error is non-nil only when the runner cannot be listed.
func (m *Mover) Drain(ctx context.Context, runner string) (DrainReport, error) {
	rep := DrainReport{Runner: runner, Moved: map[string]string{}, Failed: map[string]error{}}
	c, err := m.pool.Client(runner)
	if err != nil {
		return rep, fmt.Errorf("drain %s: %w", runner, err)
	}
	sbs, err := c.ListAllSandboxes(ctx)
	if err != nil {
		return rep, fmt.Errorf("drain %s: list sandboxes: %w", runner, err)
	}
	for _, sb := range sbs {
		if err := m.syncRoute(ctx, sb.Name); err != nil {
			rep.Failed[sb.Name] = err
			continue
		}
		if at, ok := m.pool.RunnerOf(sb.Name); ok && at != runner {
			// Moved already; this copy outlived its move (the source's
			// destroy failed). It goes only while the runner the route
			// names holds the sandbox; the lease keeps a move in flight
			// apart.
			if err := m.holds(ctx, at, sb.Name); err != nil {
				rep.Failed[sb.Name] = err
				continue
			}
			lease, err := m.store.Acquire(ctx, Lease{Sandbox: sb.Name, Holder: m.opts.Holder, From: runner, To: at}, m.opts.LeaseTTL)
			if err != nil {
				rep.Failed[sb.Name] = err
				continue
			}
			err = c.DeleteSandbox(ctx, sb.Name)
			if rerr := m.store.Release(context.WithoutCancel(ctx), lease); err == nil {
				err = rerr
			}
			if err != nil {
				rep.Failed[sb.Name] = err
				continue
			}
			rep.Removed = append(rep.Removed, sb.Name)
			continue
		}
		if sb.State != wire.SandboxSuspended {
			rep.Running = append(rep.Running, sb.Name)
			continue
		}
		to, err := m.Move(ctx, sb.Name, "")
		if err != nil {
			rep.Failed[sb.Name] = err
			continue
		}
		rep.Moved[sb.Name] = to
	}
	m.log.Info("drain: done", "runner", runner, "moved", len(rep.Moved), "removed", len(rep.Removed), "running", len(rep.Running), "failed", len(rep.Failed))
	return rep, nil
}

// holds checks that runner holds sandbox name ("": that the bucket holds
// its archive).
func (m *Mover) holds(ctx context.Context, runner, name string) error {
	if runner == "" {
		var man Manifest
		if _, err := m.store.getJSON(ctx, m.objKey(name, "manifest.json"), &man); err != nil {
			return fmt.Errorf("check the archive the route names: %w", err)
		}
		return nil
	}
	c, err := m.pool.Client(runner)
	if err != nil {
		return fmt.Errorf("check the copy on %s, which the route names: %w", runner, err)
	}
	if _, err := c.GetSandbox(ctx, name); err != nil {
		return fmt.Errorf("check the copy on %s, which the route names: %w", runner, err)
	}
	return nil
}

// DrainMarked drains every runner d lists now, in name order.
func (m *Mover) DrainMarked(ctx context.Context, d Draining) ([]DrainReport, error) {
	runners, err := d.Draining(ctx)
	if err != nil {
		return nil, fmt.Errorf("list draining runners: %w", err)
	}
	slices.Sort(runners)
	var out []DrainReport
	var errs []error
	for _, r := range runners {
		rep, err := m.Drain(ctx, r)
		out = append(out, rep)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// LoadRoutes reads every route the bucket records into the pool (a
// control plane's start: its pool then routes sandboxes moved by other
// processes), and returns how many it read.
func (m *Mover) LoadRoutes(ctx context.Context) (int, error) {
	prefix := m.store.key("routes") + "/"
	n := 0
	for obj := range m.store.mc.ListObjects(ctx, m.store.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return n, m.store.classify("list routes", obj.Err)
		}
		var r Route
		if _, err := m.store.getJSON(ctx, obj.Key, &r); err != nil {
			return n, err
		}
		if r.Sandbox != strings.TrimPrefix(obj.Key, prefix) {
			return n, fmt.Errorf("route %s names sandbox %q", obj.Key, r.Sandbox)
		}
		m.pool.SetRoute(r.Sandbox, r.Runner)
		n++
	}
	return n, nil
}
