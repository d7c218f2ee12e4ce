package shim

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// lookPathAs is lookPath with every stat done as cred's user (its uid,
// gid and groups as the file-system identity), the identity the command's
// own execve(2) resolves the path with: the shim is root, and argv[0] or
// a PATH directory may lie in the sandbox's workspace, where the command
// can make any component a symlink; a lookup as root would follow it
// anywhere and tell, by its error, whether a path exists below a
// directory the user cannot search (ENOENT or EACCES). As the user the
// lookup learns only what the user could. cred nil, or a shim that is not
// root: lookPath as the shim.
// The identity is the calling thread's alone (asUser).
func lookPathAs(cred *syscall.Credential, argv0 string, env []string, dir string) (string, error) {
	if cred == nil || os.Geteuid() != 0 || cred.Uid == 0 {
		return lookPath(argv0, env, dir)
	}
	var path string
	err := asUser(cred, func() (err error) {
		path, err = lookPath(argv0, env, dir)
		return err
	})
	return path, err
}

// asUser runs f with cred's groups and file-system uid and gid, on a
// goroutine locked to a thread of its own that never unlocks it: the
// identity is per thread (setfsuid(2), setfsgid(2) and the raw
// setgroups(2), not Go's all-threads wrappers), and the runtime discards
// the thread with it when the goroutine returns.
func asUser(cred *syscall.Credential, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if err := setFSCred(cred); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return <-done
}

// setFSCred gives the calling thread cred's groups and file-system uid
// and gid (the thread's fs capabilities drop with the uid, as for a
// setuid).
func setFSCred(cred *syscall.Credential) error {
	groups := make([]uint32, len(cred.Groups))
	copy(groups, cred.Groups)
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("look up the command as uid %d: setgroups: %w", cred.Uid, e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(cred.Gid), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(cred.Uid), 0, 0)
	// Each call returns the previous id; a second one says whether the
	// first took.
	if g, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(cred.Gid), 0, 0); uint32(g) != cred.Gid {
		return fmt.Errorf("look up the command as uid %d: setfsgid %d did not take", cred.Uid, cred.Gid)
	}
	if u, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(cred.Uid), 0, 0); uint32(u) != cred.Uid {
		return fmt.Errorf("look up the command as uid %d: setfsuid did not take", cred.Uid)
	}
	return nil
}

// openDirBeneathAs is OpenDirBeneath with the root opened as the shim and
// the rest resolved as cred's user, as the nsexec helper does after its
// user switch (the direct path has no such switch before the fork).
func openDirBeneathAs(cred *nsexecCred, root, dir string) (*os.File, error) {
	if cred == nil || os.Geteuid() != 0 || cred.UID == 0 {
		return sessiondir.OpenDirBeneath(root, dir)
	}
	return sessiondir.OpenDirBeneathAs(root, dir, func(open func() error) error {
		return asUser(&syscall.Credential{Uid: cred.UID, Gid: cred.GID, Groups: cred.Groups}, open)
	})
}
