package sandboxes

// Checkpoints of a sandbox on a btrfs volume start as a pool snapshot:
// the sandbox is frozen only for syncfs and a read-only snapshot of its
// volume (milliseconds, whatever its size), then the checkpoint's file
// tree is captured from that snapshot with the sandbox running (the
// snapshot does not change, so the capture is of one instant). The
// checkpoint is an ordinary one of its store (list, get, delete, restore,
// export, import, usage as on every driver); the pool snapshot, named by
// the checkpoint's id, is kept beside it so that a fork of the checkpoint
// is a clone of it (forkclone.go) rather than a copy, and a restore
// clones its files' blocks from it (checkpoint.Store.RestoreFrom) rather
// than decoding them. Deleting the
// checkpoint, or destroying the sandbox without keep_checkpoints, deletes
// the snapshot; a snapshot no store lists (a crash between the snapshot
// and the index, or between the index and the snapshot's delete) is
// deleted at the next start.
//
// A snapshot is used only for the sandbox whose volume it was taken of
// (storage.Pool.SnapshotOf): an id is not a secret (an archive carries
// it, and an import keeps it), so another sandbox naming the same id
// never reaches this one's snapshot.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentrunner/runner/checkpoint"
	"github.com/agentrunner/runner/daemon/registry"
)

// snapshotCheckpoint is CreateCheckpoint for a sandbox with a btrfs
// volume (clonesFrom). The caller holds sb's lock.
func (s *Manager) snapshotCheckpoint(ctx context.Context, sb registry.Sandbox, st *checkpoint.Store, comment string) (checkpoint.Info, error) {
	var rnd [8]byte
	rand.Read(rnd[:])
	id := "ck-" + hex.EncodeToString(rnd[:])
	frozen, err := s.snapshotVolume(ctx, sb, id) // forkclone.go
	if err != nil {
		return checkpoint.Info{}, err
	}
	root, err := s.pool.SnapshotPath(id)
	var trees []string
	if err == nil {
		trees, err = s.snapshotTrees(sb, root)
	}
	var info checkpoint.Info
	if err == nil {
		info, err = st.Create(ctx, trees, checkpoint.Options{Comment: comment, ID: id, Frozen: frozen})
	}
	if err != nil {
		s.dropSnapshot(ctx, sb.Name, id)
		return checkpoint.Info{}, err
	}
	return info, nil
}

// restoreStore restores checkpoint id of st into sb's disk: with its
// files cloned from the checkpoint's pool snapshot when sb has one
// (blocks shared, nothing copied), else from its chunks. Either way the
// store's staged swap makes it all or nothing across a crash. The caller
// holds sb's lock, sb suspended.
func (s *Manager) restoreStore(ctx context.Context, st *checkpoint.Store, sb registry.Sandbox, id string) error {
	if s.clonesFrom(sb) && s.ownSnapshot(sb.Name, id) {
		if root, err := s.pool.SnapshotPath(id); err == nil {
			if trees, err := s.snapshotTrees(sb, root); err == nil {
				return st.RestoreFrom(ctx, id, s.SandboxDisk(sb), trees)
			}
		}
	}
	return st.Restore(ctx, id, s.SandboxDisk(sb))
}

// snapshotTrees is SandboxDisk(sb) in the snapshot of its volume at root.
func (s *Manager) snapshotTrees(sb registry.Sandbox, root string) ([]string, error) {
	var out []string
	for _, d := range s.SandboxDisk(sb) {
		rel, err := filepath.Rel(s.pool.Path(sb.Name), d)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return nil, os.ErrInvalid
		}
		out = append(out, filepath.Join(root, rel))
	}
	return out, nil
}

// ownSnapshot says pool snapshot id was taken of sandbox name's volume.
func (s *Manager) ownSnapshot(name, id string) bool {
	if s.pool == nil {
		return false
	}
	from, err := s.pool.SnapshotOf(id)
	return err == nil && from == name
}

// dropSnapshot deletes pool snapshot id when it is sandbox name's (a
// checkpoint of it); absent is success. A failure is logged: the next
// start deletes a snapshot no store lists.
func (s *Manager) dropSnapshot(ctx context.Context, name, id string) {
	if !s.ownSnapshot(name, id) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageOpTimeout)
	defer cancel()
	if err := s.pool.DeleteSnapshot(ctx, id); err != nil {
		s.log.Warn("delete a checkpoint's snapshot; the next start does", "sandbox", name, "checkpoint", id, "err", err)
	}
}

// dropSnapshots deletes the pool snapshots of every checkpoint sandbox
// name's store lists (its destroy without keep_checkpoints).
func (s *Manager) dropSnapshots(ctx context.Context, name string) {
	if s.pool == nil {
		return
	}
	if _, err := os.Stat(s.checkpointDir(name)); err != nil {
		return
	}
	rd, err := s.ReadCheckpointStore(name)
	if err != nil {
		return
	}
	list, _ := rd.List()
	rd.Close()
	for _, c := range list {
		s.dropSnapshot(ctx, name, c.ID)
	}
}

// listedCheckpoint says sandbox name's store lists checkpoint id, reading
// its index without opening (or making) the store.
func (s *Manager) listedCheckpoint(name, id string) bool {
	if _, err := os.Stat(s.checkpointDir(name)); err != nil {
		return false
	}
	rd, err := checkpoint.OpenForReading(s.checkpointDir(name))
	if err != nil {
		return true // unknown: keep it
	}
	defer rd.Close()
	_, err = rd.Get(id)
	return err == nil
}
