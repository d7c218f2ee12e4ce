package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// Checkpoints (docs/protocol.md, "Checkpoints"). Each sandbox's
// checkpoints are one checkpoint.Store in STATE/checkpoints/NAME, apart
// from its disk. Every call that changes a store (create, delete,
// restore) holds the sandbox's lock, which also keeps spawns, suspend,
// resume and destroy of that sandbox out meanwhile; list and get read the
// store's atomically replaced index without it.

// SandboxDisk is the list of directories that make up the sandbox's disk,
// in a fixed order: what a checkpoint captures and a restore replaces.
// Today the workspace; a layer the isolation work keeps per sandbox (an
// overlay's upper directory) is added here, and only here.
func (s *Manager) SandboxDisk(sb registry.Sandbox) []string {
	return []string{sb.Workspace}
}

func (s *Manager) checkpointDir(name string) string {
	return filepath.Join(s.cfg.StateDir, "checkpoints", name)
}

// CheckpointUsage is the bytes sandbox name's checkpoints occupy on disk,
// for its disk budget.
func (s *Manager) CheckpointUsage(name string) (int64, error) {
	return checkpoint.DirUsage(s.checkpointDir(name))
}

// CanCheckpoint says whether checkpoints are delivered: only where the
// sandbox's processes can be frozen, so a checkpoint is one instant and
// never a tree that changed while it was read.
func (s *Manager) CanCheckpoint() error {
	if s.cg == nil {
		return apierr.NotSupported("checkpoints need cgroups (runnerd --cgroups): without a freezer a checkpoint would not be one instant")
	}
	if err := s.cg.CanFreeze(); err != nil {
		return apierr.NotSupported("checkpoints need the cgroup freezer: %v", err)
	}
	return nil
}

// openCheckpoints opens sandbox name's store and recovers it from a crash
// (an interrupted checkpoint or restore swap). The caller holds the
// sandbox's lock: recovery must never meet an attempt in progress.
func (s *Manager) openCheckpoints(name string) (*checkpoint.Store, error) {
	st, err := checkpoint.Open(s.checkpointDir(name))
	if err != nil {
		return nil, CheckpointErr(err, "")
	}
	return st, nil
}

// ReadCheckpointStore opens sandbox name's store for List and Get, without
// the lock and so without recovery.
func (s *Manager) ReadCheckpointStore(name string) (*checkpoint.Store, error) {
	st, err := checkpoint.OpenForReading(s.checkpointDir(name))
	if err != nil {
		return nil, CheckpointErr(err, "")
	}
	return st, nil
}

// RecoverCheckpoints opens every store at start, which finishes or rolls
// back a restore swap that runnerd's death interrupted, before any
// sandbox's disk is used.
func (s *Manager) RecoverCheckpoints() error {
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

// CheckpointErr maps a checkpoint.Store error into the taxonomy (nil
// stays nil).
// freezeTimeout bounds how long a checkpoint waits for the kernel to stop
// every process of a sandbox.
const freezeTimeout = 10 * time.Second

func CheckpointErr(err error, id string) error {
	var ae *apierr.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, checkpoint.ErrUnknown):
		return apierr.Invalid("no such checkpoint %q", id)
	case errors.Is(err, checkpoint.ErrCorrupt):
		return &apierr.Error{Status: wire.CodeRestoreFailed.Status(), Code: wire.CodeRestoreFailed, Detail: err.Error()}
	case errors.Is(err, checkpoint.ErrInvalid):
		return apierr.Invalid("%v", err)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return apierr.WriteFailed("checkpoint storage full: %v", err)
	}
	return apierr.Unavailable("%v", err)
}

func ToWireCheckpoint(name string, c checkpoint.Info) wire.Checkpoint {
	return wire.Checkpoint{ID: c.ID, Sandbox: name, Comment: c.Comment, Created: c.Created,
		Size: c.Size, StoredBytes: c.Stored, Files: c.Files, FrozenMS: c.Frozen.Milliseconds()}
}

// CreateCheckpoint captures sandbox name's disk. A running sandbox's
// processes are frozen (cgroup freezer) while the trees are walked and the
// changed files read, then thawed; shims stay outside the cgroup, so a
// session's output waits in its pipe or PTY and reaches the journal after
// the thaw, none of it lost. A suspended sandbox has nothing to freeze.
func (s *Manager) CreateCheckpoint(ctx context.Context, name, comment string) (wire.Checkpoint, error) {
	if err := s.CanCheckpoint(); err != nil {
		return wire.Checkpoint{}, err
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.Scoped(ctx, name)
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
		opt.Freeze = s.freezer(name)
	}
	start := time.Now()
	var info checkpoint.Info
	if s.clonesFrom(sb) {
		info, err = s.snapshotCheckpoint(ctx, sb, st, comment) // snapcheckpoint.go: a pool snapshot, its tree captured unfrozen
	} else {
		info, err = st.Create(ctx, s.SandboxDisk(sb), opt)
	}
	if err != nil {
		return wire.Checkpoint{}, CheckpointErr(err, "")
	}
	s.metrics.ObserveCheckpoint(time.Since(start), info.Frozen, info.Stored)
	s.log.Info("checkpoint created", "sandbox", name, "checkpoint", info.ID, "size", info.Size,
		"stored", info.Stored, "frozen", info.Frozen)
	return ToWireCheckpoint(name, info), nil
}

// freezer freezes the processes of sandbox name (running; the caller
// holds its lock) and returns the thaw.
func (s *Manager) freezer(name string) func(ctx context.Context) (func() error, error) {
	return func(ctx context.Context) (func() error, error) {
		// The freeze is bounded on its own: a sandbox whose processes
		// cannot all be stopped (one stuck in uninterruptible sleep)
		// must not hold the sandbox's lock for the client's whole
		// timeout.
		fctx, cancel := context.WithTimeout(ctx, freezeTimeout)
		defer cancel()
		thaw, err := s.cg.Freeze(fctx, name)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, apierr.Unavailable("the sandbox's processes did not all stop within %v; nothing was captured, try again", freezeTimeout)
		}
		if errors.Is(err, cgroup.ErrNotFound) {
			// No cgroup: no process of the sandbox runs (every command
			// is placed in it before it runs), so nothing to freeze.
			return func() error { return nil }, nil
		}
		return thaw, err
	}
}

// RestoreCheckpoint replaces sandbox name's disk with checkpoint id. A
// running sandbox is parked first (suspend: its sessions end as a suspend
// ends them; their journals stay), restored, and resumed; a suspended one
// stays suspended. An unknown id is refused before anything is stopped; a
// restore that fails (a corrupted checkpoint: restore_failed) leaves the
// old disk and resumes the sandbox it parked.
func (s *Manager) RestoreCheckpoint(ctx context.Context, name, id string) (registry.Sandbox, error) {
	if err := s.CanCheckpoint(); err != nil {
		return registry.Sandbox{}, err
	}
	sb, err := s.Scoped(ctx, name)
	if err != nil {
		return sb, err
	}
	rd, err := s.ReadCheckpointStore(name)
	if err != nil {
		return sb, err
	}
	_, err = rd.Get(id)
	rd.Close()
	if err != nil {
		return sb, CheckpointErr(err, id)
	}
	wasRunning := sb.State == wire.SandboxRunning
	if wasRunning {
		if sb, err = s.Suspend(ctx, name); err != nil {
			return sb, err
		}
	}
	start := time.Now()
	err = func() error {
		unlock := s.locks.Lock(name)
		defer unlock()
		if sb, err = s.Scoped(ctx, name); err != nil {
			return err
		}
		if sb.State != wire.SandboxSuspended {
			return apierr.Conflict("sandbox resumed while its restore waited")
		}
		st, err := s.openCheckpoints(name)
		if err != nil {
			return err
		}
		defer st.Close()
		return s.restoreStore(ctx, st, sb, id) // snapcheckpoint.go
	}()
	if err != nil {
		// A failed restore swapped nothing (checkpoint.Store.Restore):
		// the sandbox goes back to running on its old disk.
		if wasRunning {
			if _, rerr := s.Resume(ctx, name); rerr != nil {
				s.log.Warn("resume after a failed restore", "sandbox", name, "err", rerr)
			}
		}
		return sb, CheckpointErr(err, id)
	}
	s.metrics.ObserveRestore(time.Since(start))
	s.log.Info("checkpoint restored", "sandbox", name, "checkpoint", id)
	if wasRunning {
		return s.Resume(ctx, name)
	}
	return sb, nil
}

// removeCheckpoints removes sandbox name's checkpoints as it is destroyed,
// unless the caller asked to keep them (keep: wire.QueryKeepCheckpoints).
func (s *Manager) removeCheckpoints(name string, keep bool) error {
	if keep {
		return nil
	}
	s.dropSnapshots(context.Background(), name) // snapcheckpoint.go
	if err := os.RemoveAll(s.checkpointDir(name)); err != nil {
		return apierr.Unavailable("remove checkpoints: %v", err)
	}
	return nil
}

// readCheckpoints checks the capability and sandbox name (scoped to the
// incarnation ctx names), and opens its store for a read.
func (s *Manager) readCheckpoints(ctx context.Context, name string) (*checkpoint.Store, error) {
	if err := s.CanCheckpoint(); err != nil {
		return nil, err
	}
	if _, err := s.Scoped(ctx, name); err != nil {
		return nil, err
	}
	return s.ReadCheckpointStore(name)
}

// ListCheckpoints lists sandbox name's checkpoints, without its lock.
func (s *Manager) ListCheckpoints(ctx context.Context, name string) (wire.Checkpoints, error) {
	out := wire.Checkpoints{Checkpoints: []wire.Checkpoint{}}
	st, err := s.readCheckpoints(ctx, name)
	if err != nil {
		return out, err
	}
	defer st.Close()
	all, err := st.List()
	if err != nil {
		return out, CheckpointErr(err, "")
	}
	for _, c := range all {
		out.Checkpoints = append(out.Checkpoints, ToWireCheckpoint(name, c))
	}
	return out, nil
}

// GetCheckpoint returns checkpoint id of sandbox name, without its lock.
func (s *Manager) GetCheckpoint(ctx context.Context, name, id string) (wire.Checkpoint, error) {
	st, err := s.readCheckpoints(ctx, name)
	if err != nil {
		return wire.Checkpoint{}, err
	}
	defer st.Close()
	c, err := st.Get(id)
	if err != nil {
		return wire.Checkpoint{}, CheckpointErr(err, id)
	}
	return ToWireCheckpoint(name, c), nil
}

// DeleteCheckpoint deletes checkpoint id of sandbox name under its lock;
// absent is success (nil), as for every DELETE.
func (s *Manager) DeleteCheckpoint(ctx context.Context, name, id string) error {
	if err := s.CanCheckpoint(); err != nil {
		return err
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	if _, err := s.Scoped(ctx, name); err != nil {
		return err
	}
	st, err := s.openCheckpoints(name)
	if err != nil {
		return err
	}
	defer st.Close()
	err = st.Delete(id)
	if errors.Is(err, checkpoint.ErrUnknown) {
		err = nil
	}
	if err == nil {
		s.dropSnapshot(ctx, name, id) // snapcheckpoint.go
	}
	return CheckpointErr(err, id)
}

// ExportCheckpoint writes checkpoint id of sandbox name to w as an archive
// (docs/archive.md) and returns the bytes written. base, when not empty,
// is a checkpoint of the same sandbox the receiver already holds: the
// archive then leaves out every chunk base names (an incremental export,
// which the receiver refuses, restore_failed, unless it does hold them).
// It reads without the sandbox's lock, as list and get do, so a slow
// reader never holds up the sandbox; a checkpoint deleted while it
// streams ends the archive without its end record, which every importer
// refuses. Nothing is written before id and base are known to exist.
func (s *Manager) ExportCheckpoint(ctx context.Context, name, id, base string, w io.Writer) (int64, error) {
	st, err := s.readCheckpoints(ctx, name)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	var have func(string) bool
	if base != "" {
		if have, err = st.Chunks(base); err != nil {
			return 0, CheckpointErr(err, base)
		}
	}
	n, err := st.Export(ctx, id, w, have)
	if err != nil {
		return n, CheckpointErr(err, id)
	}
	s.log.Info("checkpoint exported", "sandbox", name, "checkpoint", id, "base", base, "bytes", n)
	return n, nil
}

// ImportCheckpoint reads one archive from r into sandbox name's store,
// under its lock, and returns the checkpoint and whether it is new (false:
// the store listed it already, identical, and nothing changed). Every
// owner in it becomes the sandbox's (importOwner) and setuid bits are
// cleared (checkpoint.Owner says why). A corrupted, truncated or hostile
// archive is restore_failed with nothing kept.
func (s *Manager) ImportCheckpoint(ctx context.Context, name string, r io.Reader) (wire.Checkpoint, bool, error) {
	if err := s.CanCheckpoint(); err != nil {
		return wire.Checkpoint{}, false, err
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.Scoped(ctx, name)
	if err != nil {
		return wire.Checkpoint{}, false, err
	}
	owner, err := importOwner(sb)
	if err != nil {
		return wire.Checkpoint{}, false, err
	}
	st, err := s.openCheckpoints(name)
	if err != nil {
		return wire.Checkpoint{}, false, err
	}
	defer st.Close()
	before, err := st.List()
	if err != nil {
		return wire.Checkpoint{}, false, CheckpointErr(err, "")
	}
	info, err := st.ImportAs(ctx, r, owner)
	if err != nil {
		return wire.Checkpoint{}, false, importErr(err)
	}
	created := !slices.ContainsFunc(before, func(c checkpoint.Info) bool { return c.ID == info.ID })
	if created {
		s.log.Info("checkpoint imported", "sandbox", name, "checkpoint", info.ID, "size", info.Size, "stored", info.Stored)
	}
	return ToWireCheckpoint(name, info), created, nil
}

// importOwner is who owns what a restore of an imported checkpoint
// writes: the sandbox's identity, or else its workspace's owner (the user
// its commands run as).
func importOwner(sb registry.Sandbox) (checkpoint.Owner, error) {
	if sb.Identity != nil {
		return checkpoint.Owner{UID: int(sb.Identity.UID), GID: int(sb.Identity.GID)}, nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(sb.Workspace, &st); err != nil {
		return checkpoint.Owner{}, apierr.Unavailable("stat workspace: %v", err)
	}
	return checkpoint.Owner{UID: int(st.Uid), GID: int(st.Gid)}, nil
}

// importErr maps an import's error: a body over the route's limit
// (http.MaxBytesReader) is 413 invalid; an archive that ends early is
// restore_failed (checkpoint.ErrCorrupt) as any other malformed one.
func importErr(err error) error {
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return apierr.TooLarge(mbe.Limit)
	}
	return CheckpointErr(err, "")
}
