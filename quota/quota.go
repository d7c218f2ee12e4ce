// Package quota sets and reads per-directory-tree disk budgets with the
// kernel's project quotas (ext4 mounted with prjquota, xfs with
// prjquota/pquota): a directory gets a project id with the inherit flag,
// so every file and directory created below it is charged to that id, and
// the project's block and inode hard limits make the file system refuse
// (EDQUOT) a write past them. The kernel lets a writer with
// CAP_SYS_RESOURCE exceed them (a root process, such as a session's shim
// writing its journal); an unprivileged one (an isolated sandbox's
// command) cannot.
//
// Invariants: nothing here reports a limit the kernel does not hold —
// SetLimit reads the limit back and fails unless the kernel has exactly
// what was asked (rounded up to its 1 KiB block unit); Supported fails
// unless the file system has project quota accounting and enforcement on.
// Linux only; it needs CAP_SYS_ADMIN (quotactl) and the owner or
// CAP_FOWNER (the project id).
package quota

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNotSupported is returned by Supported (and wrapped by the other
// functions) when the file system has no project quotas enabled.
var ErrNotSupported = errors.New("project quotas are not enabled on this file system")

// From linux/quota.h and linux/fs.h (x/sys/unix does not carry them).
const (
	prjQuota    = 2        // PRJQUOTA
	qGetInfo    = 0x800005 // Q_GETINFO
	qGetQuota   = 0x800007 // Q_GETQUOTA
	qSetQuota   = 0x800008 // Q_SETQUOTA
	qifBLimits  = 1        // QIF_BLIMITS
	qifILimits  = 4        // QIF_ILIMITS
	qifSpace    = 2        // QIF_SPACE
	qifInodes   = 8        // QIF_INODES
	blockUnit   = 1024     // QIF_DQBLKSIZE: the unit of the block limits
	fsGetXattr  = 0x801c581f
	fsSetXattr  = 0x401c5820
	projInherit = 0x200 // FS_XFLAG_PROJINHERIT
	// dqfEnforced... the v2 quota format reports enforcement through
	// if_dqinfo flags only for some file systems; Supported probes with
	// Q_GETQUOTA instead, which fails with ESRCH when quotas are off.
)

// ifDqblk is struct if_dqblk.
type ifDqblk struct {
	BHardLimit uint64
	BSoftLimit uint64
	CurSpace   uint64
	IHardLimit uint64
	ISoftLimit uint64
	CurInodes  uint64
	BTime      uint64
	ITime      uint64
	Valid      uint32
	_          uint32
}

// ifDqinfo is struct if_dqinfo.
type ifDqinfo struct {
	BGrace uint64
	IGrace uint64
	Flags  uint32
	Valid  uint32
}

// fsxattr is struct fsxattr.
type fsxattr struct {
	XFlags     uint32
	ExtSize    uint32
	NExtents   uint32
	ProjID     uint32
	CowExtSize uint32
	_          [8]byte
}

// Limit is a project's hard limits; 0 means none.
type Limit struct {
	Bytes  int64
	Inodes int64
}

// Usage is what a project holds now.
type Usage struct {
	Bytes  int64
	Inodes int64
}

func quotactl(dir string, cmd int, id uint32, addr unsafe.Pointer) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, f.Fd(), uintptr(cmd<<8|prjQuota), uintptr(id), uintptr(addr), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Supported returns nil when the file system holding dir has project
// quotas on (accounted and enforced), ErrNotSupported when it has not, or
// the error that kept it from telling.
func Supported(dir string) error {
	var info ifDqinfo
	err := quotactl(dir, qGetInfo, 0, unsafe.Pointer(&info))
	switch {
	case errors.Is(err, unix.ESRCH), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%s: %w (%v)", dir, ErrNotSupported, err)
	case err != nil:
		return fmt.Errorf("probe project quotas of %s: %w", dir, err)
	}
	return nil
}

// SetProject gives dir project id and the inherit flag, so that what is
// created below it from now on is charged to id. Files already below it
// keep their project (callers set it on a new, empty directory).
func SetProject(dir string, id uint32) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("set project of %s: %w", dir, err)
	}
	defer f.Close()
	var x fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsGetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("set project of %s: get attributes: %w", dir, e)
	}
	x.ProjID = id
	x.XFlags |= projInherit
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsSetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("set project of %s: %w", dir, e)
	}
	var got fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsGetXattr, uintptr(unsafe.Pointer(&got))); e != 0 {
		return fmt.Errorf("set project of %s: read back: %w", dir, e)
	}
	if got.ProjID != id || got.XFlags&projInherit == 0 {
		return fmt.Errorf("set project of %s: the kernel holds project %d flags %#x, want %d with inherit", dir, got.ProjID, got.XFlags, id)
	}
	return nil
}

// SetLimit sets project id's hard limits on the file system holding dir
// and reads them back: it fails unless the kernel holds them. Bytes are
// rounded up to the kernel's 1 KiB unit.
func SetLimit(dir string, id uint32, l Limit) error {
	if l.Bytes < 0 || l.Inodes < 0 {
		return fmt.Errorf("set quota of project %d: negative limit %+v", id, l)
	}
	q := ifDqblk{
		BHardLimit: uint64((l.Bytes + blockUnit - 1) / blockUnit),
		IHardLimit: uint64(l.Inodes),
		Valid:      qifBLimits | qifILimits,
	}
	if err := quotactl(dir, qSetQuota, id, unsafe.Pointer(&q)); err != nil {
		if errors.Is(err, unix.ESRCH) {
			err = fmt.Errorf("%w (%v)", ErrNotSupported, err)
		}
		return fmt.Errorf("set quota of project %d on %s: %w", id, dir, err)
	}
	got, _, err := Get(dir, id)
	if err != nil {
		return err
	}
	want := Limit{Bytes: int64(q.BHardLimit) * blockUnit, Inodes: l.Inodes}
	if got != want {
		return fmt.Errorf("set quota of project %d on %s: the kernel holds %+v, want %+v", id, dir, got, want)
	}
	return nil
}

// Get returns project id's hard limits and usage on the file system
// holding dir.
func Get(dir string, id uint32) (Limit, Usage, error) {
	var q ifDqblk
	if err := quotactl(dir, qGetQuota, id, unsafe.Pointer(&q)); err != nil {
		return Limit{}, Usage{}, fmt.Errorf("get quota of project %d on %s: %w", id, dir, err)
	}
	l := Limit{Bytes: int64(q.BHardLimit) * blockUnit, Inodes: int64(q.IHardLimit)}
	var u Usage
	if q.Valid&qifSpace != 0 {
		u.Bytes = int64(q.CurSpace)
	}
	if q.Valid&qifInodes != 0 {
		u.Inodes = int64(q.CurInodes)
	}
	return l, u, nil
}
