package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Checkpoints (docs/protocol.md, "Checkpoints"). Each sandbox's
// checkpoints are one checkpoint.Store in STATE/checkpoints/NAME, apart
// from its disk. Every call that changes a store (create, delete,
// restore) holds the sandbox's lock, which also keeps spawns, suspend,
// resume and destroy of that sandbox out meanwhile; list and get read the
// store's atomically replaced index without it.

// sandboxDisk is the list of directories that make up the sandbox's disk,
// in a fixed order: what a checkpoint captures and a restore replaces.
// Today the workspace; a layer the isolation work keeps per sandbox (an
// overlay's upper directory) is added here, and only here.
func (s *server) sandboxDisk(sb registry.Sandbox) []string {
	return []string{sb.Workspace}
}

func (s *server) checkpointDir(name string) string {
	return filepath.Join(s.cfg.StateDir, "checkpoints", name)
}

// CheckpointUsage is the bytes sandbox name's checkpoints occupy on disk,
// for its disk budget.
func (s *server) CheckpointUsage(name string) (int64, error) {
	return checkpoint.DirUsage(s.checkpointDir(name))
}

// canCheckpoint says whether checkpoints are delivered: only where the
// sandbox's processes can be frozen, so a checkpoint is one instant and
// never a tree that changed while it was read.
func (s *server) canCheckpoint() error {
	if s.cg == nil {
		return errNotSupported("checkpoints need cgroups (runnerd --cgroups): without a freezer a checkpoint would not be one instant")
	}
	if err := s.cg.CanFreeze(); err != nil {
		return errNotSupported("checkpoints need the cgroup freezer: %v", err)
	}
	return nil
}

// openCheckpoints opens sandbox name's store and recovers it from a crash
// (an interrupted checkpoint or restore swap). The caller holds the
// sandbox's lock: recovery must never meet an attempt in progress.
func (s *server) openCheckpoints(name string) (*checkpoint.Store, error) {
	st, err := checkpoint.Open(s.checkpointDir(name))
	if err != nil {
		return nil, checkpointErr(err, "")
	}
	return st, nil
}

// readCheckpointStore opens sandbox name's store for List and Get, without
// the lock and so without recovery.
func (s *server) readCheckpointStore(name string) (*checkpoint.Store, error) {
	st, err := checkpoint.OpenForReading(s.checkpointDir(name))
	if err != nil {
		return nil, checkpointErr(err, "")
	}
	return st, nil
}

// recoverCheckpoints opens every store at start, which finishes or rolls
// back a restore swap that runnerd's death interrupted, before any
// sandbox's disk is used.
func (s *server) recoverCheckpoints() error {
	entries, err := os.ReadDir(filepath.Join(s.cfg.StateDir, "checkpoints"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		st, err := checkpoint.Open(s.checkpointDir(e.Name()))
		if err != nil {
			return fmt.Errorf("checkpoints of %s: %w", e.Name(), err)
		}
		st.Close()
	}
	return nil
}

// checkpointErr maps a checkpoint.Store error into the taxonomy (nil
// stays nil).
// freezeTimeout bounds how long a checkpoint waits for the kernel to stop
// every process of a sandbox.
const freezeTimeout = 10 * time.Second

func checkpointErr(err error, id string) error {
	var ae *apiError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, checkpoint.ErrUnknown):
		return errInvalid("no such checkpoint %q", id)
	case errors.Is(err, checkpoint.ErrCorrupt):
		return &apiError{status: wire.CodeRestoreFailed.Status(), code: wire.CodeRestoreFailed, detail: err.Error()}
	case errors.Is(err, checkpoint.ErrInvalid):
		return errInvalid("%v", err)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return errWriteFailed("checkpoint storage full: %v", err)
	}
	return errUnavailable("%v", err)
}

func toWireCheckpoint(name string, c checkpoint.Info) wire.Checkpoint {
	return wire.Checkpoint{ID: c.ID, Sandbox: name, Comment: c.Comment, Created: c.Created,
		Size: c.Size, StoredBytes: c.Stored, Files: c.Files, FrozenMS: c.Frozen.Milliseconds()}
}

func (s *server) handleCreateCheckpoint(w http.ResponseWriter, r *http.Request) {
	var req wire.CreateCheckpoint
	if err := decodeJSON(w, r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Comment) > wire.MaxCheckpointComment {
		s.writeError(w, r, errInvalid("comment longer than %d bytes", wire.MaxCheckpointComment))
		return
	}
	c, err := s.createCheckpoint(r.Context(), r.PathValue("name"), req.Comment)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusCreated, c)
}

// createCheckpoint captures sandbox name's disk. A running sandbox's
// processes are frozen (cgroup freezer) while the trees are walked and the
// changed files read, then thawed; shims stay outside the cgroup, so a
// session's output waits in its pipe or PTY and reaches the journal after
// the thaw, none of it lost. A suspended sandbox has nothing to freeze.
func (s *server) createCheckpoint(ctx context.Context, name, comment string) (wire.Checkpoint, error) {
	if err := s.canCheckpoint(); err != nil {
		return wire.Checkpoint{}, err
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.scopedSandbox(ctx, name)
	if err != nil {
		return wire.Checkpoint{}, err
	}
	st, err := s.openCheckpoints(name)
	if err != nil {
		return wire.Checkpoint{}, err
	}
	defer st.Close()
	opt := checkpoint.Options{Comment: comment}
	if sb.State == wire.SandboxRunning {
		opt.Freeze = func(ctx context.Context) (func() error, error) {
			// The freeze is bounded on its own: a sandbox whose processes
			// cannot all be stopped (one stuck in uninterruptible sleep)
			// must not hold the sandbox's lock for the client's whole
			// timeout.
			fctx, cancel := context.WithTimeout(ctx, freezeTimeout)
			defer cancel()
			thaw, err := s.cg.Freeze(fctx, name)
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return nil, errUnavailable("the sandbox's processes did not all stop within %v; nothing was captured, try again", freezeTimeout)
			}
			if errors.Is(err, cgroup.ErrNotFound) {
				// No cgroup: no process of the sandbox runs (every command
				// is placed in it before it runs), so nothing to freeze.
				return func() error { return nil }, nil
			}
			return thaw, err
		}
	}
	start := time.Now()
	info, err := st.Create(ctx, s.sandboxDisk(sb), opt)
	if err != nil {
		return wire.Checkpoint{}, checkpointErr(err, "")
	}
	s.metrics.observeCheckpoint(time.Since(start), info.Frozen, info.Stored)
	s.log.Info("checkpoint created", "sandbox", name, "checkpoint", info.ID, "size", info.Size,
		"stored", info.Stored, "frozen", info.Frozen)
	return toWireCheckpoint(name, info), nil
}

// readCheckpoints checks the capability and the sandbox, and opens its
// store for a read.
func (s *server) readCheckpoints(r *http.Request) (*checkpoint.Store, error) {
	if err := s.canCheckpoint(); err != nil {
		return nil, err
	}
	if _, err := s.scopedSandbox(r.Context(), r.PathValue("name")); err != nil {
		return nil, err
	}
	return s.readCheckpointStore(r.PathValue("name"))
}

func (s *server) handleListCheckpoints(w http.ResponseWriter, r *http.Request) {
	st, err := s.readCheckpoints(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer st.Close()
	all, err := st.List()
	if err != nil {
		s.writeError(w, r, checkpointErr(err, ""))
		return
	}
	out := wire.Checkpoints{Checkpoints: []wire.Checkpoint{}}
	for _, c := range all {
		out.Checkpoints = append(out.Checkpoints, toWireCheckpoint(r.PathValue("name"), c))
	}
	s.writeJSON(w, http.StatusOK, out)
}

func (s *server) handleGetCheckpoint(w http.ResponseWriter, r *http.Request) {
	st, err := s.readCheckpoints(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer st.Close()
	c, err := st.Get(r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, checkpointErr(err, r.PathValue("id")))
		return
	}
	s.writeJSON(w, http.StatusOK, toWireCheckpoint(r.PathValue("name"), c))
}

func (s *server) handleDeleteCheckpoint(w http.ResponseWriter, r *http.Request) {
	name, id := r.PathValue("name"), r.PathValue("id")
	if err := s.canCheckpoint(); err != nil {
		s.writeError(w, r, err)
		return
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	if _, err := s.scopedSandbox(r.Context(), name); err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.openCheckpoints(name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer st.Close()
	err = st.Delete(id)
	if errors.Is(err, checkpoint.ErrUnknown) {
		err = nil // absent is success, as for every DELETE
	}
	s.writeNoContent(w, r, checkpointErr(err, id))
}

func (s *server) handleRestore(w http.ResponseWriter, r *http.Request) {
	sb, err := s.restoreCheckpoint(r.Context(), r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, toWireSandbox(sb))
}

// restoreCheckpoint replaces sandbox name's disk with checkpoint id. A
// running sandbox is parked first (suspend: its sessions end as a suspend
// ends them; their journals stay), restored, and resumed; a suspended one
// stays suspended. An unknown id is refused before anything is stopped; a
// restore that fails (a corrupted checkpoint: restore_failed) leaves the
// old disk and resumes the sandbox it parked.
func (s *server) restoreCheckpoint(ctx context.Context, name, id string) (registry.Sandbox, error) {
	if err := s.canCheckpoint(); err != nil {
		return registry.Sandbox{}, err
	}
	sb, err := s.scopedSandbox(ctx, name)
	if err != nil {
		return sb, err
	}
	rd, err := s.readCheckpointStore(name)
	if err != nil {
		return sb, err
	}
	_, err = rd.Get(id)
	rd.Close()
	if err != nil {
		return sb, checkpointErr(err, id)
	}
	wasRunning := sb.State == wire.SandboxRunning
	if wasRunning {
		if sb, err = s.suspendSandbox(ctx, name); err != nil {
			return sb, err
		}
	}
	start := time.Now()
	err = func() error {
		unlock := s.locks.Lock(name)
		defer unlock()
		if sb, err = s.scopedSandbox(ctx, name); err != nil {
			return err
		}
		if sb.State != wire.SandboxSuspended {
			return errConflict("sandbox resumed while its restore waited")
		}
		st, err := s.openCheckpoints(name)
		if err != nil {
			return err
		}
		defer st.Close()
		return st.Restore(ctx, id, s.sandboxDisk(sb))
	}()
	if err != nil {
		// A failed restore swapped nothing (checkpoint.Store.Restore):
		// the sandbox goes back to running on its old disk.
		if wasRunning {
			if _, rerr := s.resumeSandbox(ctx, name); rerr != nil {
				s.log.Warn("resume after a failed restore", "sandbox", name, "err", rerr)
			}
		}
		return sb, checkpointErr(err, id)
	}
	s.metrics.observeRestore(time.Since(start))
	s.log.Info("checkpoint restored", "sandbox", name, "checkpoint", id)
	if wasRunning {
		return s.resumeSandbox(ctx, name)
	}
	return sb, nil
}

// removeCheckpoints removes sandbox name's checkpoints as it is destroyed,
// unless the caller asked to keep them (wire.QueryKeepCheckpoints, carried
// in ctx by handleDeleteSandbox).
func (s *server) removeCheckpoints(ctx context.Context, name string) error {
	if keep, _ := ctx.Value(keepCheckpointsKey{}).(bool); keep {
		return nil
	}
	if err := os.RemoveAll(s.checkpointDir(name)); err != nil {
		return errUnavailable("remove checkpoints: %v", err)
	}
	return nil
}

type keepCheckpointsKey struct{}

// withKeepCheckpoints reads wire.QueryKeepCheckpoints into the context
// destroySandbox gets.
func withKeepCheckpoints(r *http.Request) (context.Context, error) {
	switch v := r.URL.Query().Get(wire.QueryKeepCheckpoints); v {
	case "", "0", "false":
		return r.Context(), nil
	case "1", "true":
		return context.WithValue(r.Context(), keepCheckpointsKey{}, true), nil
	default:
		return nil, errInvalid("%s=%q: want true or false", wire.QueryKeepCheckpoints, v)
	}
}

// checkpointMetrics are the checkpoint series of /metrics.
type checkpointMetrics struct {
	created, restored prometheus.Histogram
	frozen            prometheus.Histogram
	stored            prometheus.Counter
}

func newCheckpointMetrics(reg *prometheus.Registry) checkpointMetrics {
	buckets := []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := checkpointMetrics{
		created: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnerd_checkpoint_duration_seconds",
			Help: "Time to make a checkpoint, freeze included.", Buckets: buckets}),
		restored: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnerd_restore_duration_seconds",
			Help: "Time to restore a checkpoint (staging and swap; not the park and resume around it).", Buckets: buckets}),
		frozen: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnerd_checkpoint_frozen_seconds",
			Help: "Time a sandbox's processes were frozen for a checkpoint.", Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30}}),
		stored: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnerd_checkpoint_stored_bytes_total",
			Help: "Bytes checkpoints added to their stores (compressed chunks not stored before, and snapshots)."}),
	}
	reg.MustRegister(m.created, m.restored, m.frozen, m.stored)
	return m
}

func (m *metrics) observeCheckpoint(d, frozen time.Duration, stored int64) {
	m.ckpt.created.Observe(d.Seconds())
	m.ckpt.frozen.Observe(frozen.Seconds())
	m.ckpt.stored.Add(float64(stored))
}

func (m *metrics) observeRestore(d time.Duration) { m.ckpt.restored.Observe(d.Seconds()) }
