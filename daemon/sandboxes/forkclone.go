package sandboxes

// Forks by clone: where the source's disk is a volume of a btrfs pool and
// the fork names no checkpoint (its source's disk now), the fork's disk
// is a copy-on-write clone of a snapshot of the source's volume instead
// of a checkpoint copied file by file. The source is frozen only for
// syncfs and the snapshot (milliseconds, whatever its size), no
// checkpoint of it is made, and the clone shares every block until one
// side writes it.
//
// The clone holds the source's whole volume as its uid left it. Before it
// appears at its path (storage.Pool.CloneAs prepares it in the pool's
// root-only staging) everything but the workspace is removed (the
// source's private /tmp, /var/tmp, /dev/shm) and the workspace is made
// root's, 0700, so no uid but root reaches into it. Once the new
// sandbox's identity exists (fill, after the record) every entry is given
// to it, setuid (and setgid on files) cleared, and device nodes, fifos
// and sockets removed, as a file-tree checkpoint would never have held
// them; nothing of the new sandbox runs yet. The snapshot is deleted once
// the fork is answered (finish); one a crash left is deleted at the next
// start (RecoverForks: by its intent, and every "fork-" snapshot left).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// forkSnapPrefix names the pool snapshots forks take: no other snapshot
// of the pool starts with it.
const forkSnapPrefix = "fork-"

// clonesFrom says a fork of src's disk now is a clone: src has a volume
// of a btrfs pool.
func (s *Manager) clonesFrom(src registry.Sandbox) bool {
	return s.pool != nil && s.pool.Driver() == storage.Btrfs && s.hasVolume(src)
}

// clones says f's disk is a clone of a pool snapshot.
func (f *fork) clones() bool { return f != nil && f.snap != "" }

// snapshotSource takes pool snapshot snap of sandbox name's volume, under
// its lock (snapshotVolume).
func (s *Manager) snapshotSource(ctx context.Context, name, snap string) error {
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.Scoped(ctx, name)
	if err != nil {
		return err
	}
	if !s.clonesFrom(sb) {
		return apierr.Unavailable("sandbox %q has no volume of a btrfs pool to snapshot", name)
	}
	frozen, err := s.snapshotVolume(ctx, sb, snap)
	if err != nil {
		return err
	}
	s.log.Info("fork: source snapshotted", "sandbox", name, "snapshot", snap, "frozen", frozen)
	return nil
}

// snapshotVolume takes pool snapshot snap of sb's volume: freeze (when
// running), syncfs, snapshot, thaw; it returns how long sb was frozen.
// The caller holds sb's lock. A failure leaves no snapshot.
func (s *Manager) snapshotVolume(ctx context.Context, sb registry.Sandbox, snap string) (time.Duration, error) {
	var thaw func() error
	var err error
	if sb.State == wire.SandboxRunning {
		if thaw, err = s.freezer(sb.Name)(ctx); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageOpTimeout)
	defer cancel()
	err = syncfsAt(s.pool.Path(sb.Name))
	if err == nil {
		err = s.pool.Snapshot(sctx, sb.Name, snap)
	}
	frozen := time.Since(start)
	if thaw != nil {
		if terr := thaw(); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw: %w", terr))
		}
	}
	if err != nil {
		if derr := s.pool.DeleteSnapshot(sctx, snap); derr != nil {
			s.log.Warn("delete a failed snapshot; the next start does", "snapshot", snap, "err", derr)
		}
		return frozen, storageErr(err, "snapshot the volume")
	}
	return frozen, nil
}

func syncfsAt(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return &os.PathError{Op: "syncfs", Path: dir, Err: err}
	}
	return nil
}

func newForkSnap() string {
	var b [8]byte
	rand.Read(b[:])
	return forkSnapPrefix + hex.EncodeToString(b[:])
}

// cloneVolume is Create's step 3 for a fork by clone: the new sandbox's
// volume, a clone of the source's snapshot with limits l, prepared
// (pruneClone) before it appears. It returns what makeVolume does.
func (f *fork) cloneVolume(ctx context.Context, l storage.Limits) (ws string, held storage.Limits, made bool, err error) {
	s := f.m
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageOpTimeout)
	defer cancel()
	if err := s.pool.Delete(ctx, f.name); err != nil { // one a crashed destroy or undo left
		return "", held, false, storageErr(err, "delete a stale volume")
	}
	vol, err := s.pool.CloneAs(ctx, f.snap, f.name, l, pruneClone)
	if errors.Is(err, storage.ErrNotFound) && f.borrowed {
		return "", held, false, apierr.NotFound("checkpoint %q of sandbox %q does not exist (deleted during the fork)", f.id, f.src)
	}
	if err != nil {
		return "", held, false, storageErr(err, fmt.Sprintf("fork %s: clone the source's volume", f.name))
	}
	return s.volumeWorkspace(f.name), vol.Limits, true, nil
}

// pruneClone keeps only the workspace of a clone of another sandbox's
// volume (root is the clone's root, which only root reaches) and makes
// it root's, 0700.
func pruneClone(root string) error {
	ents, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() != "workspace" {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				return err
			}
		}
	}
	ws := filepath.Join(root, "workspace")
	fi, err := os.Lstat(ws)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("the source's workspace is a %v, not a directory", fi.Mode().Type())
	}
	if err := os.Lchown(ws, 0, 0); err != nil {
		return err
	}
	return os.Chmod(ws, 0o700)
}

// fillClone is fill for a fork by clone: every entry of the workspace
// given to owner, setuid and setgid (but on directories) cleared, device
// nodes, fifos and sockets removed. No uid but root reaches the tree
// (pruneClone) and no process of the new sandbox runs yet, so a walk by
// path meets no change under it.
func fillClone(ws string, uid, gid int) error {
	return filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		t := d.Type()
		switch {
		case t&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket|fs.ModeIrregular) != 0:
			return os.Remove(p)
		case t&fs.ModeSymlink != 0:
			return os.Lchown(p, uid, gid)
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		clear := fs.ModeSetuid
		if !d.IsDir() {
			clear |= fs.ModeSetgid
		}
		if fi.Mode()&clear != 0 {
			return os.Chmod(p, fi.Mode()&^clear&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		}
		return nil
	})
}

// sweepForkSnapshots deletes every pool snapshot a fork took (at start,
// once the intents are handled, none belongs to a fork in progress) and
// every checkpoint's snapshot its sandbox's store does not list.
func (s *Manager) sweepForkSnapshots(ctx context.Context) {
	if s.pool == nil {
		return
	}
	snaps, err := s.pool.Snapshots()
	if err != nil {
		s.log.Error("recover forks: list pool snapshots", "err", err)
		return
	}
	for _, snap := range snaps {
		drop := strings.HasPrefix(snap, forkSnapPrefix)
		if strings.HasPrefix(snap, "ck-") { // snapcheckpoint.go: a checkpoint's, unless no store lists it
			from, err := s.pool.SnapshotOf(snap)
			drop = err == nil && !s.listedCheckpoint(from, snap)
		}
		if drop {
			if err := s.pool.DeleteSnapshot(ctx, snap); err != nil {
				s.log.Error("recover: delete a snapshot nothing uses", "snapshot", snap, "err", err)
			}
		}
	}
}
