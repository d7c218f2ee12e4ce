package sandboxes

// The sandbox lifecycle: create, suspend, resume and destroy, each under
// the sandbox's lock. The HTTP surface is in sandboxes.go; what happens to
// a sandbox's sessions is in spawn.go and stopping.go, to its network in
// network.go.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
)

func (s *Manager) Workspace(name string) string {
	return filepath.Join(s.cfg.StateDir, "sandboxes", name)
}

// Create creates sandbox req.Name, or returns the existing one when
// it was created with the same user (and, when req asks for one, the same
// network policy): a create is idempotent. The order:
//
//  1. validate: the name, the network policy (refused where policies are
//     not enforced), the limits (likewise; parseLimits fills the host's
//     defaults), the run-as user (must exist on the host; never root for
//     an isolated sandbox, identityFor);
//  2. take the sandbox's lock;
//  3. make the workspace, 0700, before the record, so a record always names
//     a workspace that exists (a directory a failed create left is reused);
//     with a budget driver, the sandbox's volume and the workspace in it
//     (makeVolume, disk.go);
//  4. commit the record with the identity of an isolated sandbox that
//     names no user, allocated in the same transaction
//     (registry.CreateSandboxIdentity), or find the existing one and
//     refuse a different user or policy (conflict); then get or create
//     its cgroup with the recorded limits (createCgroup; different limits
//     asked of an existing sandbox are a conflict), so a retry repairs it;
//  5. set up the network namespace of a contained sandbox (ensureNet), so
//     no command can run outside it;
//  6. the workspace is given to the sandbox's identity (ownWorkspace, on
//     every create: it repairs a crash before it), or a new sandbox's to
//     its run-as user.
//
// A new sandbox whose steps 4-6 fail is undone (undoCreate): a failed
// create leaves nothing, and its retry starts afresh. With req.From the
// create is a fork (fork.go: the source's checkpoint or snapshot taken
// before step 2, the new workspace filled between steps 4 and 5).
func (s *Manager) Create(ctx context.Context, req wire.CreateSandbox) (_ registry.Sandbox, err error) {
	p, err := s.planCreate(req)
	if err != nil {
		return registry.Sandbox{}, err
	}
	fk, err := s.prepareFork(ctx, req) // fork.go: nil unless req.From
	if err != nil {
		return registry.Sandbox{}, err
	}
	defer fk.finish(ctx)
	unlock := s.locks.Lock(req.Name)
	defer unlock()
	if err := fk.begin(); err != nil {
		return registry.Sandbox{}, err
	}
	defer func() { fk.end(err) }()
	var ws string
	var madeWS, madeVol bool
	var held storage.Limits
	if fk.clones() {
		ws, held, madeVol, err = fk.cloneVolume(ctx, p.disk) // forkclone.go
	} else if s.DiskBudgets() {
		ws, held, madeVol, err = s.makeVolume(ctx, req.Name, p.disk) // disk.go
	} else {
		ws, madeWS, err = s.makeWorkspace(req.Name)
	}
	if err != nil {
		return registry.Sandbox{}, err
	}
	sb, created, err := s.reg.CreateSandboxIdentity(registry.Sandbox{
		Name:      req.Name,
		State:     wire.SandboxRunning,
		CreatedAt: time.Now().UTC(),
		Workspace: ws,
		User:      req.User,
		Network:   p.network,
		Isolated:  p.isolated,
		Limits:    diskLimits(p.limits, held),
		Pod:       p.pod,
	}, p.pool)
	if err != nil {
		s.undoWorkspace(ws, madeWS)
		if madeVol {
			if derr := s.deleteVolume(ctx, req.Name); derr != nil {
				s.log.Warn("undo failed create: delete volume", "sandbox", req.Name, "err", derr)
			}
		}
		return sb, apierr.RegistryWrite(err) // diskfull.go
	}
	if created {
		// A new sandbox whose setup fails below is undone: a failed
		// create leaves nothing, and a retry starts afresh (undo.go).
		defer func() {
			if err != nil {
				s.undoCreate(ctx, sb, madeWS, madeVol)
			}
		}()
	}
	// The limits an existing sandbox is compared with (createCgroup):
	// its disk budget as the kernel holds it.
	if created {
		p.limits = sb.Limits
	} else if s.hasVolume(sb) {
		p.limits = diskLimits(p.limits, recordedDisk(sb, p.disk))
	}
	if !created && req.User != "" && sb.User != req.User { // absent: whatever it is, as network
		return sb, apierr.ConflictFor(wire.ReasonSandboxExists, "%s: sandbox %q exists with user %q", wire.DetailConflict, sb.Name, sb.User)
	}
	// A create that asks for containment never gets a sandbox contained
	// less (or differently) than asked; one that does not ask gets the
	// sandbox as it is.
	if !created && p.asked && !sameNetwork(sb.Network, p.network) {
		return sb, apierr.ConflictFor(wire.ReasonSandboxExists, "%s: sandbox %q exists with a different network policy (change it with PUT /v1/sandboxes/%s/network)", wire.DetailConflict, sb.Name, sb.Name)
	}
	if err := fk.fill(ctx, sb, created, p); err != nil { // fork.go: the checkpoint's files
		return sb, err
	}
	if err := s.setUpSandbox(ctx, sb, created, p, req.Limits != nil); err != nil {
		return sb, err
	}
	if created {
		if p.uid >= 0 {
			if err := os.Chown(ws, p.uid, p.gid); err != nil {
				s.log.Warn("chown workspace", "sandbox", sb.Name, "err", err)
			}
		}
		s.log.Info("sandbox created", "sandbox", sb.Name, "incarnation", sb.Incarnation, "contained", sb.Network != nil)
		if sb.Network != nil {
			s.warnRootContained(sb)
		}
	}
	return sb, nil
}

// createPlan is a create request checked before anything is made: the
// network policy (asked: the request named one), the limits with the
// host's defaults, the run-as user's ids (-1 without one) and the
// identity of an isolated sandbox.
type createPlan struct {
	network  *wire.Network
	asked    bool
	limits   *wire.Limits
	uid, gid int
	pool     *registry.IdentityPool
	isolated bool
	// disk is the volume's limits (zero: no volume, disk.go).
	disk storage.Limits
	// pod is the record's Pod of a sandbox that is a pod (pods.go; no
	// holder yet), nil otherwise.
	pod *registry.Pod
}

// planCreate is Create's step 1: it validates req and settles
// what the sandbox will be, making nothing.
func (s *Manager) planCreate(req wire.CreateSandbox) (p createPlan, err error) {
	if err := ValidName(req.Name); err != nil {
		return p, err
	}
	if req.Network != nil {
		if s.net == nil {
			return p, ErrNoNetPolicy()
		}
		if p.network, err = ParseNetwork(*req.Network); err != nil {
			return p, err
		}
	}
	if p.disk, err = s.planDisk(req.Limits); err != nil { // disk.go: invalid or not_supported before anything is made
		return p, err
	}
	if p.limits, err = s.parseLimits(cgroupPart(req.Limits)); err != nil { // limits.go: not_supported or invalid before anything is made
		return p, err
	}
	p.uid, p.gid = -1, -1
	if s.cfg.Pods && s.ids.enabled {
		// Every sandbox is a pod; user names its user inside, root by
		// default (an unprivileged id of its block outside).
		if _, err := podUser(req.User); err != nil {
			return p, err
		}
		pool := s.ids.pool
		p.pool, p.isolated, p.pod = &pool, true, &registry.Pod{}
	} else if req.User != "" {
		u, err := user.Lookup(req.User)
		if err != nil {
			return p, apierr.Invalid("user %q: %v", req.User, err)
		}
		p.uid, _ = strconv.Atoi(u.Uid)
		p.gid, _ = strconv.Atoi(u.Gid)
	}
	if p.pod == nil {
		if p.pool, p.isolated, err = s.identityFor(req.Name, req.User, p.uid, p.gid, p.network != nil); err != nil {
			return p, err
		}
	}
	p.asked = p.network != nil
	if !p.asked && p.isolated && s.net != nil {
		// Isolated means its own network too: open egress, never the host
		// or another sandbox (identity.go).
		p.network = s.openEgress()
	}
	return p, nil
}

// makeWorkspace is Create's step 3: it makes sandbox name's
// workspace, 0700, and says whether it made it (madeWS: removed again if
// the create fails, undo.go). The caller holds the sandbox's lock.
func (s *Manager) makeWorkspace(name string) (ws string, madeWS bool, err error) {
	ws = s.Workspace(name)
	_, wsErr := os.Lstat(ws)
	madeWS = errors.Is(wsErr, os.ErrNotExist)
	// 0700 (and owned by the run-as user, below): the workspace is the
	// agent's memory and may hold its credentials; no other local user,
	// including another sandbox's run-as user, may read it.
	if err := os.MkdirAll(ws, 0o700); err != nil {
		return "", false, apierr.Unavailable("create workspace: %v", err)
	}
	if err := os.Chmod(ws, 0o700); err != nil { // a directory left by a failed create
		return "", false, apierr.Unavailable("create workspace: %v", err)
	}
	return ws, madeWS, nil
}

// setUpSandbox is Create's steps 4b-6 for the committed sandbox
// sb: its cgroup, its network namespace, its workspace's owner and its
// private directories. limitsAsked says the request named limits.
func (s *Manager) setUpSandbox(ctx context.Context, sb registry.Sandbox, created bool, p createPlan, limitsAsked bool) error {
	if err := s.createCgroup(sb, created, limitsAsked, p.limits); err != nil { // limits.go
		return err
	}
	if sb.Network != nil && (created || p.asked) {
		// Contained before create returns, so no command can run outside.
		// The namespace outlives this request: a client that goes away
		// must not cancel its setup half-way. Bound it instead.
		nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := s.ensureNet(nctx, sb); err != nil {
			return err
		}
	}
	if err := s.ownWorkspace(sb); err != nil {
		return err
	}
	if s.Isolated(sb) && s.ids.enabled {
		// Made now, so its commands need no inode for them later
		// (privatetmp.go); undone with the sandbox if this create fails.
		if _, err := s.ensurePrivateTmp(sb); err != nil {
			return err
		}
	}
	if InPod(sb) && sb.State == wire.SandboxRunning {
		// Made once, here: its sessions join it (pods.go). A re-create
		// adopts the one its record names.
		if _, err := s.ensurePod(ctx, s.current(sb)); err != nil {
			return err
		}
	}
	return nil
}

// Destroy destroys sandbox name and everything it holds. Absent is
// success (nil): also a sandbox whose incarnation is not the one ctx names
// (scoped), which this call must not touch. The order, under the
// sandbox's lock, each step only once the one before succeeded, so a
// failure leaves a sandbox a retry can destroy:
//
//  1. read the record; absent: sweep a workspace a failed create left,
//     and succeed;
//  2. terminate every session and every process a session started
//     (Sessions.StopAll, Config.TerminateGrace): after it no process of
//     the sandbox runs;
//  3. remove its private /tmp, /var/tmp, /dev/shm (removePrivateTmp),
//     its cgroup (removeCgroup: kills anything left, the backstop),
//     then tear down its network namespace (teardownNet): nothing is in
//     either;
//  4. remove each session's directory (journal included);
//  5. remove the workspace (delete its volume, disk.go);
//  6. delete its preview tokens, then its record (sessions with it, and
//     its identity freed in the same transaction): the record goes last,
//     so a crash before leaves a sandbox to destroy again, never files
//     without a record, and no process or file of the sandbox is left
//     when its uid can go to another.
func (s *Manager) Destroy(ctx context.Context, name string, keepCheckpoints bool) error {
	if err := ValidName(name); err != nil {
		return err
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.reg.GetSandbox(name)
	if errors.Is(err, registry.ErrNotFound) {
		os.RemoveAll(s.Workspace(name))
		// A volume a create left when it died before its record.
		return s.deleteVolume(ctx, name)
	}
	if err != nil {
		return apierr.Unavailable("read registry: %v", err)
	}
	if CheckIncarnation(ctx, sb) != nil {
		// The caller's incarnation is gone; the live sandbox is a newer
		// one.
		return nil
	}
	sessions, err := s.sessions.StopAll(ctx, name, s.cfg.TerminateGrace)
	if err != nil {
		return err
	}
	if err := s.endPod(ctx, sb, true); err != nil { // pods.go: every process of the pod with it
		return err
	}
	if err := s.removePrivateTmp(sb); err != nil { // privatetmp.go
		return err
	}
	if err := s.removeCgroup(ctx, name); err != nil { // limits.go
		return err
	}
	if err := s.teardownNet(ctx, sb); err != nil {
		return err
	}
	for _, ss := range sessions {
		if err := os.RemoveAll(s.sessions.Dir(ss)); err != nil {
			return apierr.Unavailable("remove session %s: %v", ss.ID, err)
		}
	}
	if s.hasVolume(sb) {
		if err := s.deleteVolume(ctx, name); err != nil { // disk.go: the workspace with it
			return err
		}
	} else if err := os.RemoveAll(s.Workspace(name)); err != nil {
		return apierr.Unavailable("remove workspace: %v", err)
	}
	if err := s.removeCheckpoints(name, keepCheckpoints); err != nil { // checkpoints.go
		return err
	}
	if err := s.reg.DeletePreviews(name); err != nil {
		return apierr.RegistryWrite(err) // diskfull.go
	}
	if err := s.reg.DeleteSandbox(name); err != nil {
		return apierr.RegistryWrite(err)
	}
	s.sessions.Forget(name) // journal budgets, session counts
	s.ReplenishReserve()
	s.log.Info("sandbox destroyed", "sandbox", name)
	return nil
}

// Suspend stops every process of sandbox name (Sessions.StopAll,
// cfg.SuspendGrace), removes its cgroup, then records it suspended: no session starts until
// it is resumed. Suspending a suspended sandbox returns it as it is.
func (s *Manager) Suspend(ctx context.Context, name string) (registry.Sandbox, error) {
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.Scoped(ctx, name)
	if err != nil || sb.State == wire.SandboxSuspended {
		return sb, err
	}
	if _, err := s.sessions.StopAll(ctx, name, s.cfg.SuspendGrace); err != nil {
		return sb, err
	}
	if err := s.endPod(ctx, sb, false); err != nil { // pods.go; resume makes it again
		return sb, err
	}
	if err := s.removeCgroup(ctx, name); err != nil { // limits.go; resume re-creates it
		return sb, err
	}
	sb, err = s.reg.UpdateSandbox(name, func(sb *registry.Sandbox) error {
		now := time.Now().UTC()
		sb.State = wire.SandboxSuspended
		sb.ParkedAt = &now
		return nil
	})
	if err != nil {
		return sb, s.RegistryErr(err, name)
	}
	s.log.Info("sandbox suspended", "sandbox", name)
	return sb, nil
}

// Resume records sandbox name running again, once its workspace is
// still there (restore_failed when it is not), and re-creates its cgroup
// with the recorded limits.
func (s *Manager) Resume(ctx context.Context, name string) (registry.Sandbox, error) {
	if err := ValidName(name); err != nil {
		return registry.Sandbox{}, err
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	was := ""
	sb, err := s.reg.UpdateSandbox(name, func(sb *registry.Sandbox) error {
		if err := CheckIncarnation(ctx, *sb); err != nil {
			return err
		}
		was = sb.State
		if _, err := os.Stat(sb.Workspace); err != nil {
			return &apierr.Error{Status: http.StatusInternalServerError, Code: wire.CodeRestoreFailed,
				Detail: fmt.Sprintf("workspace: %v", err)}
		}
		sb.State = wire.SandboxRunning
		sb.ParkedAt = nil
		return nil
	})
	if err != nil {
		return sb, s.RegistryErr(err, name)
	}
	// With its recorded limits; a failure here is repaired by the next
	// spawn (SessionCgroups) or resume.
	if err := s.EnsureCgroup(sb); err != nil { // limits.go
		return sb, err
	}
	if InPod(sb) {
		// Made again (its upper layers and workspace kept what it
		// installed); a failure here is repaired by the next spawn.
		if _, err := s.ensurePod(ctx, sb); err != nil {
			return sb, err
		}
	}
	if was == wire.SandboxSuspended {
		s.log.Info("sandbox resumed", "sandbox", sb.Name, "incarnation", sb.Incarnation)
	}
	return sb, nil
}
