package sandboxes

// Forks (docs/protocol.md, "Forks"): POST /v1/sandboxes with From makes
// a new sandbox whose workspace starts as a checkpoint of another. Create
// does the fork in its own steps (sandboxlife.go), with three calls here:
//
//  1. prepareFork, before the new sandbox's lock: the source and the
//     checkpoint are checked (not_found only when the registry or the
//     checkpoint store says so; a name that exists is a conflict before
//     anything is made), and with no checkpoint named the source is
//     checkpointed now, under its own lock, which is released again: no
//     two sandboxes' locks are ever held at once.
//  2. begin, under the new sandbox's lock: the name is checked again and
//     the intent (STATE/forks/NAME.json) is written, durable, before
//     anything of the new sandbox is made.
//  3. fill, once the record is committed (the identity the files are
//     given to is allocated with it) and before the sandbox is set up:
//     the checkpoint is written into a staging directory beside the
//     workspace (checkpoint.Store.Materialize: every owner remapped,
//     setuid cleared, every chunk's hash checked), then renamed over the
//     empty workspace.
//
// A fork that fails is undone as any create (undo.go): no record, no
// workspace, no volume; the checkpoint it took of the source is deleted
// again (finish). The intent is in phase "fill" from begin until the
// workspace holds the whole checkpoint, then "done". A runnerd killed in
// phase "fill" leaves a record, workspace or volume (no cgroup or
// network yet: setUpSandbox comes after fill), and the next start
// (RecoverForks, before any request) removes them with the staging; in
// either phase it deletes the checkpoint the fork took. After fill the
// sandbox is whole, and a crash in the rest of Create is a plain
// create's (a retry repairs it). The source's store is read without its
// lock, as an export reads it: a checkpoint deleted meanwhile fails the
// fork (not_found or restore_failed), nothing kept.
//
// Owners: every entry is given to the new sandbox (its identity, or its
// run-as user, or else its workspace's owner, as an import is), so a
// fork of one isolated sandbox never hands files to the source's uid.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/wire"
)

// fork is one fork in progress: Create's handle on it. A nil *fork is a
// create that is no fork; every method accepts it.
type fork struct {
	m    *Manager
	name string // the new sandbox
	src  string // the source sandbox
	id   string // the checkpoint
	// made says the fork took checkpoint id itself (From.Checkpoint
	// empty): finish deletes it again.
	made bool
	// snap, for a fork by clone (forkclone.go), is the pool snapshot it
	// clones: one it took of the source in place of a checkpoint (finish
	// deletes it), or the named checkpoint's own (borrowed: kept).
	snap     string
	borrowed bool
	// in is the intent as last written; marked says begin wrote it.
	in     forkIntent
	marked bool
}

// forkIntent is STATE/forks/NAME.json: a fork runnerd has begun and not
// finished (see the file's comment for its phases).
type forkIntent struct {
	Phase string `json:"phase"`
	// Incarnation is the new sandbox's, once its record is committed.
	Incarnation string `json:"incarnation,omitempty"`
	Source      string `json:"source"`
	Checkpoint  string `json:"checkpoint,omitempty"`
	Made        bool   `json:"made,omitempty"`
	// Snap is the pool snapshot of a fork by clone.
	Snap string `json:"snap,omitempty"`
}

const (
	phaseFill = "fill"
	phaseDone = "done"
)

func (s *Manager) forkDir() string { return filepath.Join(s.cfg.StateDir, "forks") }

func (s *Manager) intentPath(name string) string {
	return filepath.Join(s.forkDir(), name+".json")
}

// forkStaging is where fill writes the checkpoint's tree for workspace
// ws: beside it, in a directory no sandbox can write (STATE/sandboxes or
// the volume's root, both root's) under a name no sandbox takes (a
// sandbox name is a DNS label: no leading dot).
func forkStaging(ws string) string {
	return filepath.Join(filepath.Dir(ws), ".fork-"+filepath.Base(ws))
}

// prepareFork is a fork's step 1 (see the file's comment); nil for a
// create that is no fork. It makes nothing but, with no checkpoint named,
// the source's checkpoint, which finish deletes whatever happens next.
func (s *Manager) prepareFork(ctx context.Context, req wire.CreateSandbox) (*fork, error) {
	from := req.From
	if from == nil {
		return nil, nil
	}
	if err := s.CanCheckpoint(); err != nil { // a fork is a checkpoint put into a new sandbox
		return nil, err
	}
	if err := ValidName(from.Sandbox); err != nil {
		return nil, err
	}
	if from.Sandbox == req.Name {
		return nil, apierr.Invalid("from.sandbox %q is the new sandbox's own name: a sandbox cannot be forked into itself", req.Name)
	}
	sctx := WithIncarnation(ctx, from.Incarnation)
	src, err := s.Scoped(sctx, from.Sandbox)
	if err != nil {
		return nil, err
	}
	if err := s.refuseExisting(req.Name); err != nil {
		return nil, err
	}
	f := &fork{m: s, name: req.Name, src: from.Sandbox, id: from.Checkpoint}
	if f.id == "" && s.clonesFrom(src) { // forkclone.go
		f.snap = newForkSnap()
		if err := s.snapshotSource(sctx, from.Sandbox, f.snap); err != nil {
			return nil, err
		}
		return f, nil
	}
	if f.id == "" {
		ck, err := s.CreateCheckpoint(sctx, from.Sandbox, "fork to "+req.Name)
		if err != nil {
			return nil, err
		}
		f.id, f.made = ck.ID, true
		return f, nil
	}
	rd, err := s.ReadCheckpointStore(from.Sandbox)
	if err != nil {
		return nil, err
	}
	_, err = rd.Get(f.id)
	rd.Close()
	if err != nil {
		return nil, f.err(err)
	}
	if s.clonesFrom(src) && s.ownSnapshot(src.Name, f.id) { // snapcheckpoint.go
		f.snap, f.borrowed = f.id, true
	}
	return f, nil
}

// refuseExisting is a conflict when sandbox name exists: a fork never
// returns (or changes) an existing sandbox, as a plain create would.
func (s *Manager) refuseExisting(name string) error {
	_, err := s.reg.GetSandbox(name)
	switch {
	case err == nil:
		return apierr.ConflictFor(wire.ReasonSandboxExists, "%s: sandbox %q exists; a fork makes a new sandbox (destroy it first, or fork to another name)", wire.DetailConflict, name)
	case !errors.Is(err, registry.ErrNotFound):
		return apierr.Unavailable("read registry: %v", err)
	}
	return nil
}

// err maps a checkpoint store's error during a fork: an unknown
// checkpoint is not_found (the store said so), a damaged one
// restore_failed, a disk budget the checkpoint does not fit no_space.
func (f *fork) err(err error) error {
	switch {
	case errors.Is(err, checkpoint.ErrUnknown):
		return apierr.NotFound("checkpoint %q of sandbox %q does not exist", f.id, f.src)
	case apierr.IsNoSpace(err):
		return apierr.NoSpace(fmt.Sprintf("fork %s: the checkpoint does not fit the new sandbox's disk", f.name), err)
	}
	return CheckpointErr(err, f.id)
}

// begin is a fork's step 2, under the new sandbox's lock.
func (f *fork) begin() error {
	if f == nil {
		return nil
	}
	if err := f.m.refuseExisting(f.name); err != nil {
		return err
	}
	if err := f.write(phaseFill, ""); err != nil {
		return err
	}
	f.marked = true
	return nil
}

// write records the intent in phase with the new sandbox's incarnation,
// durable before it returns.
func (f *fork) write(phase, inc string) error {
	in := forkIntent{Phase: phase, Incarnation: inc, Source: f.src, Checkpoint: f.id, Made: f.made}
	if !f.borrowed {
		in.Snap = f.snap
	}
	b, err := json.Marshal(in)
	if err != nil {
		return apierr.Unavailable("record fork: %v", err)
	}
	dir := f.m.forkDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return apierr.Unavailable("record fork: %v", err)
	}
	if err := atomicfile.WriteFileSync(f.m.intentPath(f.name), b, 0o600); err != nil {
		return apierr.Unavailable("record fork: %v", err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return apierr.Unavailable("record fork: %v", err)
	}
	f.in = in
	return nil
}

// fill is a fork's step 3: sb, just recorded (created), gets the
// checkpoint's files in its workspace. p is the create's plan (the
// run-as user's ids).
func (f *fork) fill(ctx context.Context, sb registry.Sandbox, created bool, p createPlan) error {
	if f == nil {
		return nil
	}
	if !created { // begin refused it under the same lock; kept as the invariant's check
		return f.m.refuseExisting(sb.Name)
	}
	if err := f.write(phaseFill, sb.Incarnation); err != nil {
		return err
	}
	owner, err := forkOwner(sb, p)
	if err != nil {
		return err
	}
	if f.clones() {
		if err := fillClone(sb.Workspace, owner.UID, owner.GID); err != nil { // forkclone.go
			return apierr.Unavailable("fork: give the clone to the new sandbox: %v", err)
		}
		if err := f.write(phaseDone, sb.Incarnation); err != nil {
			return err
		}
		f.m.log.Info("sandbox forked", "sandbox", sb.Name, "from", f.src, "snapshot", f.snap, "owner", owner)
		return nil
	}
	disk := f.m.SandboxDisk(sb)
	staged := make([]string, len(disk))
	for i, d := range disk {
		staged[i] = forkStaging(d)
		if err := os.RemoveAll(staged[i]); err != nil { // a crashed attempt's
			return apierr.Unavailable("fork: remove old staging: %v", err)
		}
	}
	st, err := f.m.ReadCheckpointStore(f.src)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Materialize(ctx, f.id, staged, &owner); err != nil {
		return f.err(err)
	}
	for i, d := range disk {
		// The workspace was made empty by this create: replace it.
		if err := os.Remove(d); err != nil {
			return apierr.Unavailable("fork: replace workspace: %v", err)
		}
		if err := os.Rename(staged[i], d); err != nil {
			return apierr.Unavailable("fork: replace workspace: %v", err)
		}
		// The checkpoint's root mode is the source's; a workspace is 0700
		// (makeWorkspace says why).
		if err := os.Chmod(d, 0o700); err != nil {
			return apierr.Unavailable("fork: chmod workspace: %v", err)
		}
		if err := atomicfile.SyncDir(filepath.Dir(d)); err != nil {
			return apierr.Unavailable("fork: %v", err)
		}
	}
	if err := f.write(phaseDone, sb.Incarnation); err != nil {
		return err
	}
	f.m.log.Info("sandbox forked", "sandbox", sb.Name, "from", f.src, "checkpoint", f.id, "owner", owner)
	return nil
}

// forkOwner is who every entry of a fork's workspace is given to: the
// new sandbox's identity, else its run-as user, else its workspace's
// owner (importOwner).
func forkOwner(sb registry.Sandbox, p createPlan) (checkpoint.Owner, error) {
	if sb.Identity == nil && p.uid >= 0 {
		return checkpoint.Owner{UID: p.uid, GID: p.gid}, nil
	}
	return importOwner(sb)
}

// end runs under the new sandbox's lock once Create's own undo has run.
// A failed fork whose record is gone moves the intent to "done" (only
// the checkpoint is left to delete); one whose undo could not remove the
// record keeps it in "fill", so the next start removes it.
func (f *fork) end(err error) {
	if f == nil || !f.marked || err == nil || f.in.Phase == phaseDone {
		return
	}
	if sb, gerr := f.m.reg.GetSandbox(f.name); gerr == nil && sb.Incarnation == f.in.Incarnation {
		f.m.log.Error("failed fork not undone: the next start removes it", "sandbox", f.name, "err", err)
		return
	}
	if werr := f.write(phaseDone, f.in.Incarnation); werr != nil {
		f.m.log.Warn("fork: record its end", "sandbox", f.name, "err", werr)
	}
}

// finish deletes the checkpoint the fork took of its source (made), after
// the new sandbox's lock is released (no two sandboxes' locks at once),
// and then the intent.
func (f *fork) finish(ctx context.Context) {
	if f == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if f.snap != "" && !f.borrowed {
		sctx, cancel := context.WithTimeout(ctx, storageOpTimeout)
		err := f.m.pool.DeleteSnapshot(sctx, f.snap)
		cancel()
		if err != nil {
			f.m.log.Warn("fork: delete the snapshot it took of its source; the next start does", "snapshot", f.snap, "err", err)
			return
		}
	}
	if f.made {
		if err := f.m.DeleteCheckpoint(ctx, f.src, f.id); err != nil && !isNotFound(err) {
			f.m.log.Warn("fork: delete the checkpoint it took of its source; the next start retries", "sandbox", f.src, "checkpoint", f.id, "err", err)
			return
		}
	}
	if f.marked && f.in.Phase == phaseDone {
		if err := os.Remove(f.m.intentPath(f.name)); err != nil {
			f.m.log.Warn("fork: remove its intent", "sandbox", f.name, "err", err)
		}
	}
}

func isNotFound(err error) bool {
	var ae *apierr.Error
	return errors.As(err, &ae) && ae.Code == wire.CodeNotFound
}

// RecoverForks finishes the forks a killed runnerd left (their intents),
// at start, before cgroups and networks are adopted and before any
// request: a sandbox in phase "fill" is removed (workspace or volume,
// staging, then record: it has no cgroup, network or session yet), and
// the checkpoint a fork took of its source is deleted. A fork it cannot
// finish is logged and kept for the next start.
func (s *Manager) RecoverForks(ctx context.Context) {
	ents, err := os.ReadDir(s.forkDir())
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Error("recover forks: list intents", "err", err)
			return
		}
		ents = nil
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || ValidName(name) != nil {
			os.Remove(filepath.Join(s.forkDir(), e.Name())) // a torn write's temporary file
			continue
		}
		if err := s.recoverFork(ctx, name); err != nil {
			s.log.Error("recover fork: kept for the next start", "sandbox", name, "err", err)
		}
	}
	s.sweepForkSnapshots(ctx) // forkclone.go
}

func (s *Manager) recoverFork(ctx context.Context, name string) error {
	b, err := os.ReadFile(s.intentPath(name))
	if err != nil {
		return err
	}
	var in forkIntent
	if err := json.Unmarshal(b, &in); err != nil {
		return fmt.Errorf("read intent: %w", err)
	}
	if in.Phase != phaseDone {
		if err := s.removeHalfFork(ctx, name, in); err != nil {
			return err
		}
		s.log.Warn("half-made fork removed (runnerd died during it)", "sandbox", name, "from", in.Source)
	}
	if in.Snap != "" && s.pool != nil {
		if err := s.pool.DeleteSnapshot(ctx, in.Snap); err != nil {
			return fmt.Errorf("delete the source's snapshot %s: %w", in.Snap, err)
		}
	}
	if in.Made {
		if err := s.deleteCheckpointAtStart(in.Source, in.Checkpoint); err != nil {
			return fmt.Errorf("delete the source's checkpoint %s: %w", in.Checkpoint, err)
		}
	}
	return os.Remove(s.intentPath(name))
}

// removeHalfFork removes what a fork in phase "fill" made: its record
// when it is this fork's (no other incarnation was made since: no
// request was served), its volume or workspace, its staging.
func (s *Manager) removeHalfFork(ctx context.Context, name string, in forkIntent) error {
	sb, err := s.reg.GetSandbox(name)
	switch {
	case err == nil && in.Incarnation != "" && sb.Incarnation != in.Incarnation:
		return nil // not this fork's sandbox
	case err != nil && !errors.Is(err, registry.ErrNotFound):
		return fmt.Errorf("read registry: %w", err)
	}
	if err := os.RemoveAll(forkStaging(s.Workspace(name))); err != nil {
		return err
	}
	if err := os.RemoveAll(s.Workspace(name)); err != nil {
		return err
	}
	if err := s.deleteVolume(ctx, name); err != nil { // the staging in it with it
		return err
	}
	if err == nil {
		if err := s.reg.DeleteSandbox(name); err != nil {
			return fmt.Errorf("delete record: %w", err)
		}
	}
	return nil
}

// deleteCheckpointAtStart deletes checkpoint id of sandbox name's store
// (absent is success), before any request is served: no lock is needed.
func (s *Manager) deleteCheckpointAtStart(name, id string) error {
	if _, err := os.Stat(s.checkpointDir(name)); errors.Is(err, os.ErrNotExist) {
		return nil // the source was destroyed with its checkpoints
	}
	st, err := checkpoint.Open(s.checkpointDir(name))
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Delete(id); err != nil && !errors.Is(err, checkpoint.ErrUnknown) {
		return err
	}
	return nil
}
