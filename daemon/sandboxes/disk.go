package sandboxes

// Disk budgets: a sandbox's workspace (and its private /tmp, /var/tmp and
// /dev/shm directories) on a volume of runnerd's storage pool (package
// storage), whose size, and on ext4 inode count, the kernel bounds.
//
// Layout of a sandbox with a volume (the volume's root is the mount point
// the pool made, owned by root, 0755, in the pool's root-owned
// directories):
//
//	VOL/workspace      the workspace, the sandbox's identity's, 0700
//	VOL/private/ID     its private directories (privatetmp.go), root's
//
// The recorded workspace path says whether a sandbox has a volume: one
// recorded under the pool (hasVolume) has one, and one recorded under
// STATE/sandboxes (made by a runnerd on the dir driver, or before disk
// budgets existed) keeps its plain directory and has no budget.
//
// Invariants:
//
//   - Advertise or refuse: with the dir driver (--storage dir, the
//     default this step) no pool is opened, disk_bytes and disk_inodes
//     are refused 501 not_supported and runnerd says at start that disk
//     budgets are off; with btrfs, disk_inodes is refused 501 (btrfs has
//     no inode limit).
//   - A budget only grows: PUT .../limits with a smaller disk_bytes or
//     disk_inodes is 400 invalid and changes nothing; a zero (absent)
//     field keeps the current one.
//   - The volume is made before the record (a record with a pool
//     workspace always has its volume), deleted before the record at
//     destroy, and kept at park; Open at start adopts (mounts) every
//     volume an earlier runnerd left.
//   - Root never follows a path the sandbox can change: the volume's
//     root and VOL/private are root's; only VOL/workspace is the
//     sandbox's, and runnerd makes it with mkdirat under a descriptor of
//     the volume's root opened O_NOFOLLOW.

import (
	"context"
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

// Storage drivers runnerd's --storage takes: the storage package's and
// StorageAuto.
const (
	// StorageAuto picks the driver storage.DefaultDriver names (btrfs,
	// else ext4, else dir), or the one a pool in the state directory was
	// made with; a pool that cannot be opened falls back to dir, and the
	// log says why.
	StorageAuto = "auto"
)

// storageOpTimeout bounds a pool operation that must finish even when
// its client has gone away (mkfs, a subvolume delete and its cleaner).
const storageOpTimeout = 2 * time.Minute

// poolDir is the storage pool's directory under the state directory.
func (s *Manager) poolDir() string { return filepath.Join(s.cfg.StateDir, "storage") }

// StartStorage opens the storage pool the configuration names (none for
// dir) and adopts the volumes an earlier runnerd left. A driver named
// outright that fails fails Run; auto falls back to dir and says why.
// A state directory whose pool was made by another driver than the one
// named is refused: its sandboxes' workspaces are on that pool.
func (s *Manager) StartStorage(ctx context.Context) error {
	driver, why := s.cfg.Storage, "named by --storage"
	made := poolDriver(s.poolDir())
	switch {
	case driver == StorageAuto && made != "":
		driver, why = made, "the state directory's pool was made with it"
	case driver == StorageAuto:
		driver, why = storage.DefaultDriver()
	case made != "" && made != driver:
		return fmt.Errorf("storage: the pool in %s was made by driver %q, not %q (start runnerd with --storage %s or auto)", s.poolDir(), made, driver, made)
	}
	if driver == storage.Ext4 && s.cfg.DefaultDisk < 8<<20 {
		return fmt.Errorf("storage: the ext4 driver needs a default disk budget (--default-disk) of at least 8M: each volume is a file system of that size")
	}
	if driver == storage.Dir {
		s.log.Warn("disk budgets are off: the dir storage driver bounds no sandbox's disk (disk_bytes and disk_inodes are refused with not_supported; a sandbox can fill the state file system); start runnerd with --storage auto, btrfs or ext4 for budgets", "storage_driver", storage.Dir, "why", why)
		return nil
	}
	p, err := storage.Open(ctx, storage.Config{Dir: s.poolDir(), Driver: driver, Size: s.cfg.StorageSize})
	if err != nil && s.cfg.Storage == StorageAuto && made == "" {
		s.log.Warn("disk budgets are off: the storage pool could not be opened, falling back to the dir driver", "storage_driver", storage.Dir, "tried", driver, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("open storage pool: %w", err)
	}
	// The sandboxes' uids pass through the pool's directories (root's,
	// 0711: enter, never list) to their workspaces inside the volumes.
	for _, d := range []string{s.poolDir(), filepath.Dir(filepath.Dir(p.Path("x")))} {
		if err := os.Chmod(d, 0o711); err != nil {
			p.Close()
			return fmt.Errorf("open storage pool: %w", err)
		}
	}
	s.pool = p
	s.log.Info("disk budgets enforced", "storage_driver", driver, "why", why, "pool", s.poolDir(), "default_disk_bytes", s.cfg.DefaultDisk)
	return nil
}

// CloseStorage closes the pool; volumes stay mounted for the next
// runnerd to adopt.
func (s *Manager) CloseStorage() {
	if s.pool != nil {
		s.pool.Close()
	}
}

// poolDriver is the driver a pool in dir was made with, "" for none.
func poolDriver(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "driver"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// StorageDriver is the driver sandboxes' disks are on: "dir" when no
// pool is open.
func (s *Manager) StorageDriver() string {
	if s.pool == nil {
		return storage.Dir
	}
	return s.pool.Driver()
}

// DiskBudgets says disk_bytes is enforced.
func (s *Manager) DiskBudgets() bool { return s.pool != nil && s.pool.Budgets() }

// volumeWorkspace is where the workspace of a sandbox with a volume is.
func (s *Manager) volumeWorkspace(name string) string {
	return filepath.Join(s.pool.Path(name), "workspace")
}

// hasVolume says sb's disk is a volume of the pool: its recorded
// workspace is in it.
func (s *Manager) hasVolume(sb registry.Sandbox) bool {
	return s.pool != nil && sb.Workspace == s.volumeWorkspace(sb.Name)
}

func errNoDiskBudget() *apierr.Error {
	return apierr.NotSupported("disk_bytes and disk_inodes are not enforced by this runnerd: its storage driver is dir, which bounds no disk (runnerd --storage auto, btrfs or ext4 enforces them; GET /v1/info says storage_driver and disk_budgets)")
}

// planDisk validates the disk part of a create's limits and fills the
// default (--default-disk). It returns the volume's limits, zero when
// the sandbox gets no volume (no budget driver).
func (s *Manager) planDisk(req *wire.Limits) (storage.Limits, error) {
	var l storage.Limits
	if req != nil {
		l = storage.Limits{Bytes: req.DiskBytes, Inodes: req.DiskInodes}
	}
	if l.Bytes < 0 || l.Inodes < 0 {
		return l, apierr.Invalid("limits: disk_bytes %d and disk_inodes %d must not be negative", l.Bytes, l.Inodes)
	}
	if !s.DiskBudgets() {
		if l != (storage.Limits{}) {
			return l, errNoDiskBudget()
		}
		return l, nil
	}
	if l.Bytes == 0 {
		l.Bytes = s.cfg.DefaultDisk
	}
	return l, s.checkDisk(l)
}

// checkDisk refuses disk limits the pool's driver would not hold.
func (s *Manager) checkDisk(l storage.Limits) error {
	if l.Inodes != 0 && s.pool.Driver() == storage.Btrfs {
		return apierr.NotSupported("limits: disk_inodes is not enforced on the btrfs storage driver (btrfs has no inode limit); run runnerd with --storage ext4 for one, or leave disk_inodes out")
	}
	if s.pool.Driver() == storage.Ext4 && l.Bytes < 8<<20 {
		return apierr.Invalid("limits: disk_bytes %d: an ext4 volume needs at least 8388608 bytes", l.Bytes)
	}
	return nil
}

// storageErr maps a pool error into the taxonomy.
func storageErr(err error, what string) error {
	switch {
	case errors.Is(err, storage.ErrInvalid):
		return apierr.Invalid("%s: %v", what, err)
	case errors.Is(err, storage.ErrNotSupported):
		return apierr.NotSupported("%s: %v", what, err)
	case apierr.IsNoSpace(err):
		return apierr.NoSpace(what, err)
	}
	return apierr.Unavailable("%s: %v", what, err)
}

// makeVolume is Create's step 3 with a budget driver: the volume of a
// new sandbox name with limits l (a volume a crashed destroy or undo
// left under the name is deleted first: nothing of another incarnation
// reaches this one), and the workspace inside it. For an existing record
// it only checks the workspace is there (Open mounted its volume). made
// says the volume was made here (deleted again if the create fails).
func (s *Manager) makeVolume(ctx context.Context, name string, l storage.Limits) (ws string, held storage.Limits, made bool, err error) {
	ws = s.volumeWorkspace(name)
	sb, err := s.reg.GetSandbox(name)
	switch {
	case err == nil && sb.Workspace != ws:
		// A sandbox from before the pool: it keeps its plain workspace.
		w, _, err := s.makeWorkspace(name)
		return w, held, false, err
	case err == nil:
		if _, err := os.Lstat(ws); err != nil {
			return "", held, false, apierr.Unavailable("workspace of sandbox %q on its volume: %v (destroy it and create it again)", name, err)
		}
		return ws, held, false, nil
	case !errors.Is(err, registry.ErrNotFound):
		return "", held, false, apierr.Unavailable("read registry: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageOpTimeout)
	defer cancel()
	if err := s.pool.Delete(ctx, name); err != nil {
		return "", held, false, storageErr(err, "delete a stale volume")
	}
	vol, err := s.pool.Create(ctx, name, l)
	if err != nil {
		return "", held, false, storageErr(err, "create volume")
	}
	if err := makeVolumeWorkspace(vol.Path); err != nil {
		return "", held, false, errors.Join(apierr.Unavailable("create workspace: %v", err), s.deleteVolume(ctx, name))
	}
	return ws, vol.Limits, true, nil
}

// makeVolumeWorkspace makes VOL/workspace (0700; ownWorkspace gives it to
// the sandbox) through a descriptor of the volume's root, which is
// root's: no component is a link the sandbox made.
func makeVolumeWorkspace(vol string) error {
	fd, err := unix.Open(vol, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: vol, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Mkdirat(fd, "workspace", 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "mkdir", Path: filepath.Join(vol, "workspace"), Err: err}
	}
	return nil
}

// deleteVolume deletes sandbox name's volume (absent is success).
func (s *Manager) deleteVolume(ctx context.Context, name string) error {
	if s.pool == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageOpTimeout)
	defer cancel()
	if err := s.pool.Delete(ctx, name); err != nil {
		return storageErr(err, "delete volume")
	}
	return nil
}

// diskLimits puts a volume's held limits into the recorded limits l
// (nil: none yet).
func diskLimits(l *wire.Limits, held storage.Limits) *wire.Limits {
	if held == (storage.Limits{}) {
		return l
	}
	out := wire.Limits{}
	if l != nil {
		out = *l
	}
	out.DiskBytes, out.DiskInodes = held.Bytes, held.Inodes
	return &out
}

// planGrow is PUT .../limits' disk part, checked: zero fields keep the
// sandbox's current budget, a smaller one is invalid. It returns the
// limits to grow to, zero when nothing changes. The caller holds sb's
// lock.
func (s *Manager) planGrow(sb registry.Sandbox, req wire.Limits) (storage.Limits, error) {
	cur := currentDisk(sb)
	want := storage.Limits{Bytes: req.DiskBytes, Inodes: req.DiskInodes}
	if want == (storage.Limits{}) {
		return storage.Limits{}, nil
	}
	if !s.hasVolume(sb) {
		if s.DiskBudgets() {
			return storage.Limits{}, apierr.NotSupported("sandbox %q has no volume (it was created before disk budgets were on): its disk has no budget to change; destroy it and create it again for one", sb.Name)
		}
		return storage.Limits{}, errNoDiskBudget()
	}
	if want.Bytes == 0 {
		want.Bytes = cur.Bytes
	}
	// Inodes not asked stay 0 for the pool: ext4 makes them with the
	// size (what it held before, and more), and the pool's record keeps
	// what was asked, not what mkfs made.
	if want.Bytes < cur.Bytes || (want.Inodes != 0 && want.Inodes < cur.Inodes) {
		return storage.Limits{}, apierr.Invalid("limits: a disk budget only grows: disk_bytes %d, disk_inodes %d is below the current %d, %d (nothing changed)", want.Bytes, want.Inodes, cur.Bytes, cur.Inodes)
	}
	if err := s.checkDisk(want); err != nil {
		return storage.Limits{}, err
	}
	if want.Bytes == cur.Bytes && (want.Inodes == 0 || want.Inodes == cur.Inodes) {
		return storage.Limits{}, nil
	}
	return want, nil
}

// currentDisk is sb's recorded disk budget.
func currentDisk(sb registry.Sandbox) storage.Limits {
	if sb.Limits == nil {
		return storage.Limits{}
	}
	return storage.Limits{Bytes: sb.Limits.DiskBytes, Inodes: sb.Limits.DiskInodes}
}

// growDisk grows sb's volume to want (planGrow's; zero: no change) and
// returns the budget to record.
func (s *Manager) growDisk(ctx context.Context, sb registry.Sandbox, want storage.Limits) (storage.Limits, error) {
	if want == (storage.Limits{}) {
		return currentDisk(sb), nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storageOpTimeout)
	defer cancel()
	vol, err := s.pool.Grow(ctx, sb.Name, want)
	if err != nil {
		return currentDisk(sb), storageErr(err, "grow volume")
	}
	return vol.Limits, nil
}

// diskUsage reads what sb's volume holds; nil without one. Inodes are
// reported where the driver counts them (ext4).
func (s *Manager) diskUsage(ctx context.Context, sb registry.Sandbox) (bytes, inodes *int64) {
	if !s.hasVolume(sb) {
		return nil, nil
	}
	u, err := s.pool.Usage(ctx, sb.Name)
	if err != nil {
		if !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("read disk usage", "sandbox", sb.Name, "err", err)
		}
		return nil, nil
	}
	bytes = &u.Bytes
	if u.Inodes >= 0 {
		inodes = &u.Inodes
	}
	return bytes, inodes
}

// recordedDisk is the disk budget asked of an existing sandbox as it
// would have been recorded: an ext4 volume holds a few more inodes than
// asked (mkfs fills whole block groups), and some when none were asked,
// which is the same request.
func recordedDisk(sb registry.Sandbox, asked storage.Limits) storage.Limits {
	if sb.Limits != nil && asked.Bytes == sb.Limits.DiskBytes && sb.Limits.DiskInodes >= asked.Inodes {
		asked.Inodes = sb.Limits.DiskInodes
	}
	return asked
}

// cgroupPart is l without its disk fields (nil stays nil): what the
// cgroup enforces.
func cgroupPart(l *wire.Limits) *wire.Limits {
	if l == nil {
		return nil
	}
	c := *l
	c.DiskBytes, c.DiskInodes = 0, 0
	return &c
}
