package sandboxes

// Resource limits: a cgroup per sandbox (package cgroup), created with the
// sandbox, removed at suspend and destroy, re-created at resume and adopted
// at start; one leaf per session, where the shim places the command
// (sessiondir.Spec.Cgroups). The lifecycle functions call these helpers at one
// line each; the HTTP surface of limits (PUT .../limits, usage on GET) is
// here too.
//
// Invariants:
//
//   - Advertise or refuse: s.cg is non-nil only where cgroup.Manager's
//     Available is nil; otherwise resource_limits is not advertised and
//     any limit asked for is not_supported, never accepted unenforced.
//   - The registry record is the truth of a sandbox's limits; the cgroup
//     is converged to it (create, resume, adoption at start, a spawn that
//     finds it missing). A restarted runnerd removes no cgroup.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/internal/every"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// cgroupOpTimeout bounds a cgroup removal (which kills what is left and
// waits for it) that must finish even when its client has gone away.
const cgroupOpTimeout = 30 * time.Second

func errNoLimits() *apierr.Error {
	return apierr.NotSupported("resource limits are not enforced on this host (resource_limits is not advertised; see runnerd's startup log)")
}

// StartCgroups sets s.cg when the configuration asks for cgroups and the
// host can enforce limits, then adopts the running sandboxes' cgroups. It
// never fails Run: a host that cannot runs without the capability and
// says why in the log.
//
// It returns a function that stops the leaf sweep (SweepLeaves) and
// waits for it; Run calls it before the registry closes.
func (s *Manager) StartCgroups() (stop func()) {
	stop = func() {}
	if !s.cfg.Cgroups {
		s.log.Info("cgroups disabled (--cgroups=off): resource_limits is not advertised and limits are refused")
		return
	}
	m, err := cgroup.New(cgroup.Config{Root: s.cfg.CgroupRoot})
	if err == nil {
		err = m.Available()
	}
	if err != nil {
		s.log.Warn("resource limits not enforced: resource_limits is not advertised, limits are refused with not_supported and the default limits are not applied", "err", err)
		return
	}
	s.cg = m
	s.log.Info("resource limits enforced", "mode", m.Mode().String(), "root", s.cfg.CgroupRoot, "defaults", s.cfg.DefaultLimits)
	ctx, cancel := context.WithCancel(s.life)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.adoptCgroups(ctx) // recovery.go: in the background, runnerd serves
		s.SweepLeaves(ctx)
	}()
	return func() { cancel(); <-done }
}

// parseLimits validates a request's limits and fills its zero fields
// from the host's defaults. nil (absent) is the defaults alone. The
// result is nil when no limit at all applies.
func (s *Manager) parseLimits(req *wire.Limits) (*wire.Limits, error) {
	l := s.cfg.DefaultLimits
	if req != nil {
		if *req != (wire.Limits{}) && s.cg == nil {
			return nil, errNoLimits()
		}
		if req.MemoryBytes != 0 {
			l.MemoryBytes = req.MemoryBytes
		}
		if req.Pids != 0 {
			l.Pids = req.Pids
		}
		if req.CPUWeight != 0 {
			l.CPUWeight = req.CPUWeight
		}
		if req.CPUQuotaUS != 0 || req.CPUPeriodUS != 0 {
			l.CPUQuotaUS, l.CPUPeriodUS = req.CPUQuotaUS, req.CPUPeriodUS
		}
	}
	if l == (wire.Limits{}) || s.cg == nil {
		// Defaults apply only where enforced (Run warned at start).
		return nil, nil
	}
	if err := ToCgroupLimits(&l).Validate(); err != nil {
		return nil, apierr.Invalid("limits: %v", err)
	}
	return &l, nil
}

// ToCgroupLimits converts wire limits (nil: none) to cgroup.Limits.
func ToCgroupLimits(l *wire.Limits) cgroup.Limits {
	if l == nil {
		return cgroup.Limits{}
	}
	return cgroup.Limits{
		MemoryBytes: l.MemoryBytes,
		Pids:        l.Pids,
		CPUWeight:   l.CPUWeight,
		CPUQuota:    time.Duration(l.CPUQuotaUS) * time.Microsecond,
		CPUPeriod:   time.Duration(l.CPUPeriodUS) * time.Microsecond,
	}
}

// sameLimits reports whether two limits (nil: none) are equal.
func sameLimits(a, b *wire.Limits) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// EnsureCgroup gets or creates the cgroup of a running sb with its
// recorded limits; nothing for a suspended one (it has none) or without
// cgroups. The caller holds sb's lock.
func (s *Manager) EnsureCgroup(sb registry.Sandbox) error {
	if s.cg == nil || sb.State != wire.SandboxRunning {
		return nil
	}
	if err := s.cg.Ensure(sb.Name, ToCgroupLimits(sb.Limits)); err != nil {
		if errors.Is(err, cgroup.ErrInvalid) {
			return apierr.Invalid("limits: %v", err)
		}
		return apierr.Unavailable("create cgroup: %v", err) // ErrNotHeld among them: never reported enforced
	}
	return nil
}

// createCgroup is Create's step 4b: a re-create that asks for
// limits (asked) must find the same ones recorded (conflict otherwise, as
// for a network policy; absent limits take the sandbox as it is), then
// the cgroup is got or created with the recorded limits, for an existing
// record too, so a retry of a create that failed here repairs it.
func (s *Manager) createCgroup(sb registry.Sandbox, created, asked bool, limits *wire.Limits) error {
	if !created && asked && !sameLimits(sb.Limits, limits) {
		return apierr.ConflictFor(wire.ReasonSandboxExists, "%s: sandbox %q exists with different limits (change them with PUT /v1/sandboxes/%s/limits)", wire.DetailConflict, sb.Name, sb.Name)
	}
	return s.EnsureCgroup(sb)
}

// removeCgroup removes sandbox name's cgroup, killing whatever is still
// in it (the caller has stopped its sessions: this is the backstop).
// Absent, or no cgroups, is success. The caller holds name's lock.
func (s *Manager) removeCgroup(ctx context.Context, name string) error {
	if s.cg == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cgroupOpTimeout)
	defer cancel()
	if err := s.cg.Remove(ctx, name); err != nil {
		return apierr.Unavailable("remove cgroup: %v", err)
	}
	s.leaves.forget(name) // a new cgroup counts from 0, as its usage does
	return nil
}

// RemoveSessionCgroup removes session ss's leaf once its record is gone.
// A failure is only logged: the leaf goes with the sandbox's cgroup.
func (s *Manager) RemoveSessionCgroup(ctx context.Context, ss registry.Session) {
	if s.cg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cgroupOpTimeout)
	defer cancel()
	if err := s.cg.RemoveSession(ctx, ss.Sandbox, ss.ID); err != nil {
		s.log.Warn("remove session cgroup", "sandbox", ss.Sandbox, "session", ss.ID, "err", err)
	}
}

// SessionCgroups returns the directories session ss of sb's command is
// placed in (sessiondir.Spec.Cgroups), creating its leaf, and the sandbox's
// cgroup when it is missing (a retry repairs a failed create). A sandbox
// with limits on a runnerd that cannot enforce them is refused: its
// commands never run unbounded.
func (s *Manager) SessionCgroups(sb registry.Sandbox, ss registry.Session) ([]string, error) {
	if s.cg == nil {
		if l := cgroupPart(sb.Limits); l != nil && *l != (wire.Limits{}) {
			return nil, errNoLimits()
		}
		return nil, nil
	}
	dirs, err := s.cg.SessionDirs(sb.Name, ss.ID)
	if errors.Is(err, cgroup.ErrNotFound) {
		if err = s.EnsureCgroup(sb); err != nil {
			return nil, err
		}
		dirs, err = s.cg.SessionDirs(sb.Name, ss.ID)
	}
	if err != nil {
		return nil, apierr.Unavailable("create session cgroup: %v", err)
	}
	return dirs, nil
}

// UsageWithDisk is Usage and what sb's volume holds (disk.go), for GET
// of one sandbox: the disk is read by the pool's driver (a btrfs(8) run
// on btrfs), which a listing or /metrics would multiply.
func (s *Manager) UsageWithDisk(ctx context.Context, sb registry.Sandbox) *wire.Usage {
	u := s.Usage(sb)
	b, i := s.diskUsage(ctx, sb)
	if b == nil {
		return u
	}
	if u == nil {
		u = &wire.Usage{}
	}
	u.DiskBytes, u.DiskInodes = b, i
	return u
}

// Usage is sb's usage read from its cgroup; nil when it has none.
func (s *Manager) Usage(sb registry.Sandbox) *wire.Usage {
	if s.cg == nil || sb.State != wire.SandboxRunning {
		return nil
	}
	u, err := s.cg.Usage(sb.Name)
	if err != nil {
		if !errors.Is(err, cgroup.ErrNotFound) {
			s.log.Warn("read cgroup usage", "sandbox", sb.Name, "err", err)
		}
		return nil
	}
	return &wire.Usage{
		MemoryBytes:     u.MemoryBytes,
		MemoryPeakBytes: u.MemoryPeakBytes,
		CPUUsec:         uint64(u.CPUTime.Microseconds()),
		Pids:            u.Pids,
		OOMKills:        u.OOMKills + s.leaves.of(sb.Name), // v1: the kills of released leaves too
	}
}

// SetLimits replaces sandbox name's limits (zero fields: the host's
// defaults; for the disk budget, the sandbox's current one, which only
// grows, disk.go): the cgroup of a running sandbox first, then the
// volume, then the record, so the record never claims a limit the kernel
// was not given (a failed record write leaves the new limits enforced; a
// retry records them). Everything is checked before anything changes; a
// volume that fails to grow puts the old cgroup limits back.
func (s *Manager) SetLimits(ctx context.Context, name string, req wire.Limits) (registry.Sandbox, error) {
	if err := ValidName(name); err != nil {
		return registry.Sandbox{}, err
	}
	diskAsked := req.DiskBytes != 0 || req.DiskInodes != 0
	if req.DiskBytes < 0 || req.DiskInodes < 0 {
		return registry.Sandbox{}, apierr.Invalid("limits: disk_bytes %d and disk_inodes %d must not be negative", req.DiskBytes, req.DiskInodes)
	}
	if diskAsked && !s.DiskBudgets() {
		return registry.Sandbox{}, errNoDiskBudget()
	}
	cgReq := cgroupPart(&req)
	if s.cg == nil && (*cgReq != (wire.Limits{}) || !diskAsked) {
		// not_found first, as PUT .../network answers.
		if sb, err := s.Scoped(ctx, name); err != nil {
			return sb, err
		}
		return registry.Sandbox{}, errNoLimits()
	}
	var l *wire.Limits
	if s.cg != nil {
		var err error
		if l, err = s.parseLimits(cgReq); err != nil {
			return registry.Sandbox{}, err
		}
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.Scoped(ctx, name)
	if err != nil {
		return sb, err
	}
	grow, err := s.planGrow(sb, req) // disk.go: refused before anything changes
	if err != nil {
		return sb, err
	}
	cgChanged := false
	if s.cg != nil && sb.State == wire.SandboxRunning {
		if err := s.applyCgroupLimits(sb, l); err != nil {
			return sb, err
		}
		cgChanged = true
	}
	held, err := s.growDisk(ctx, sb, grow)
	if err != nil {
		if cgChanged {
			if rerr := s.cg.Ensure(name, ToCgroupLimits(sb.Limits)); rerr != nil {
				s.log.Error("restore limits after a failed disk grow", "sandbox", name, "err", rerr)
			}
		}
		return sb, err
	}
	sb, err = s.reg.UpdateSandbox(name, func(sb *registry.Sandbox) error {
		sb.Limits = diskLimits(l, held)
		return nil
	})
	if err != nil {
		return sb, s.RegistryErr(err, name)
	}
	s.log.Info("sandbox limits set", "sandbox", name, "limits", sb.Limits)
	return sb, nil
}

// applyCgroupLimits writes limits l to running sb's cgroup; on a failure
// the old ones are written back, so the cgroup holds what the record
// says.
func (s *Manager) applyCgroupLimits(sb registry.Sandbox, l *wire.Limits) error {
	name := sb.Name
	err := s.cg.Update(name, ToCgroupLimits(l))
	if errors.Is(err, cgroup.ErrNotFound) {
		err = s.cg.Ensure(name, ToCgroupLimits(l))
	}
	if err == nil {
		return nil
	}
	// The kernel may hold part of the new limits (they are written one
	// file at a time): the old ones are written back.
	kept := "the old limits stay"
	if rerr := s.cg.Ensure(name, ToCgroupLimits(sb.Limits)); rerr != nil {
		s.log.Error("restore limits after a failed update", "sandbox", name, "err", rerr)
		kept = "restoring the old limits failed too (" + rerr.Error() + "); a spawn or resume converges them"
	}
	switch {
	case errors.Is(err, cgroup.ErrInvalid):
		return apierr.Invalid("limits: %v; %s", err, kept)
	case errors.Is(err, cgroup.ErrNotHeld):
		return apierr.Unavailable("apply limits: %v; %s", err, kept)
	}
	// Lowering memory below what the sandbox holds fails (EBUSY) once
	// the kernel cannot reclaim.
	return apierr.Conflict("apply limits: %v; %s", err, kept)
}

// Meminfo returns the field of /proc/meminfo that starts with key (e.g.
// "MemTotal:"), in bytes.
func Meminfo(key string) (int64, error) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		rest, ok := strings.CutPrefix(line, key)
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse /proc/meminfo %s %q: %w", key, rest, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", key)
}

// releasedLeaves is what the leaf sweep keeps: under cgroup v1 an OOM kill
// is counted only in the victim's own leaf, so the kills of the leaves it
// removed are kept here, per sandbox, and added to its usage. They live as
// long as runnerd (a restart forgets them) and go with the sandbox's
// cgroup (suspend, destroy).
type releasedLeaves struct {
	mu    sync.Mutex        // guards kills
	kills map[string]uint64 // by sandbox
}

func (r *releasedLeaves) add(sandbox string, n uint64) {
	if n == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kills == nil {
		r.kills = map[string]uint64{}
	}
	r.kills[sandbox] += n
}

func (r *releasedLeaves) of(sandbox string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kills[sandbox]
}

func (r *releasedLeaves) forget(sandbox string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.kills, sandbox)
}

// SweepLeaves removes, every Config.LeafSweepInterval until ctx ends, the leaves
// of sessions that have ended and hold no process (releaseLeaves). Run
// starts it when cgroups are on and waits for it.
func (s *Manager) SweepLeaves(ctx context.Context) {
	every.Until(ctx, s.cfg.LeafSweepInterval, func() bool {
		names, err := s.cg.List()
		if err != nil {
			s.log.Warn("session leaves: list cgroups", "err", err)
			return true
		}
		for _, name := range names {
			if ctx.Err() != nil {
				return false
			}
			s.releaseLeaves(name)
		}
		return true
	})
}

// releaseLeaves removes the leaves of sandbox name whose session has
// ended (or has no record: a spawn that failed) and that hold no process,
// killing nothing: a background job a command left keeps its leaf until
// it ends or the session is deleted. It holds the sandbox's lock, which
// every spawn holds from before it creates its leaf to after its record
// is committed, so a leaf being set up is never taken.
func (s *Manager) releaseLeaves(name string) {
	unlock := s.locks.Lock(name)
	defer unlock()
	leaves, err := s.cg.Sessions(name)
	if err != nil {
		s.log.Warn("session leaves: list", "sandbox", name, "err", err)
		return
	}
	for _, id := range leaves {
		ss, err := s.reg.GetSession(name, id)
		switch {
		case errors.Is(err, registry.ErrNotFound):
		case err != nil:
			continue
		default:
			if ss, err = s.sessions.Refresh(ss); err != nil || ss.Exit == nil {
				continue // running, or not known to have ended
			}
		}
		kills, released, err := s.cg.ReleaseSession(name, id)
		if err != nil {
			s.log.Warn("session leaves: release", "sandbox", name, "session", id, "err", err)
			continue
		}
		if released {
			s.leaves.add(name, kills)
			s.log.Debug("session leaf released", "sandbox", name, "session", id)
		}
	}
}

// adoptCgroups converges the cgroup of every running sandbox to its
// record (get-or-create, so a cgroup a previous runnerd made keeps its
// processes and a reboot's lost ones come back). It runs in the
// background once runnerd serves (at ~1 ms a sandbox it held a restart
// with 1,000 sandboxes for a second): each sandbox under its lock, its
// record read again (one destroyed meanwhile is skipped, so its cgroup is
// never made again); a spawn meanwhile makes its sandbox's cgroup if it
// is missing. It removes nothing: a cgroup no record names is logged for
// the operator.
func (s *Manager) adoptCgroups(ctx context.Context) {
	known := map[string]bool{}
	err := s.Each(ctx, func(sb registry.Sandbox) {
		known[sb.Name] = true
		s.adoptCgroup(sb.Name)
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("adopt cgroups: read registry", "err", err)
		}
		return
	}
	names, err := s.cg.List()
	if err != nil {
		s.log.Warn("adopt cgroups: list", "err", err)
		return
	}
	for _, n := range names {
		if !known[n] {
			s.log.Warn("cgroup without a sandbox kept (remove it by hand once empty)", "cgroup", n)
		}
	}
}

// adoptCgroup converges one sandbox's cgroup under its lock.
func (s *Manager) adoptCgroup(name string) {
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.reg.GetSandbox(name)
	if err != nil {
		return // destroyed meanwhile
	}
	if err := s.EnsureCgroup(sb); err != nil {
		s.log.Warn("adopt cgroup", "sandbox", sb.Name, "err", err)
	}
	// A runnerd killed during a checkpoint left the cgroup frozen: no
	// checkpoint runs now (this runnerd holds the sandbox's lock), so
	// nothing of it should be.
	if err := s.cg.Thaw(sb.Name); err != nil {
		s.log.Warn("adopt cgroup: thaw", "sandbox", sb.Name, "err", err)
	}
}
