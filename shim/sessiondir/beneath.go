package sessiondir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Working directories confined to a root (Spec.DirRoot).
//
// A sandbox's command can replace any directory of its workspace with a
// symlink. The shim runs as root, and a path it resolved as root would
// follow that symlink anywhere: into another sandbox's workspace or
// private /tmp, into /root. So Spec.Dir is never resolved as a path:
// DirRoot (which the caller vouches for: no sandbox can change it or a
// directory above it) is opened on its own, and the rest of Dir is
// resolved relative to that descriptor with openat2(2) and
// RESOLVE_BENEATH, which fails with EXDEV as soon as a component (a
// "..", an absolute symlink, a relative one that climbs out) would leave
// the root, at any point of the walk, and with EAGAIN when a rename
// raced a ".." (retried). A symlink that stays inside the root is
// followed: it leads nowhere the command could not go with cd, and agent
// repositories use them (a "current" link to a release directory).
// RESOLVE_NO_MAGICLINKS refuses /proc-style links outright. The rest is
// resolved as the command's user (in the nsexec helper after the user
// switch, on the direct path by the shim with the user's file-system
// identity: openDirBeneathAs), so each directory below the root must let
// the user pass, as a chdir of its own would; only the root itself is
// opened by root, so that the directories above it need not be passable
// (a state directory under a 0700 home).
//
// On a kernel without openat2 (before 5.6) the rest is walked one
// component at a time with O_NOFOLLOW: every symlink is refused (ELOOP),
// inside or not.

// DirOutside is the step text of a working directory whose resolution
// would leave its root.
func DirOutside(dir, root string) string {
	return fmt.Sprintf("chdir %s: it resolves outside %s (a symlink or .. leads out)", dir, root)
}

// RelBelow returns dir relative to root ("." for root itself) when dir is
// root or lies below it, as clean absolute paths; ok is false otherwise.
func RelBelow(root, dir string) (rel string, ok bool) {
	if !filepath.IsAbs(root) || !filepath.IsAbs(dir) {
		return "", false
	}
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(dir))
	if err != nil || (rel != "." && !filepath.IsLocal(rel)) {
		return "", false
	}
	return rel, true
}

// OpenBeneath opens rel (a clean local path, or ".") below the directory
// open at root, as a directory (O_PATH, close-on-exec), without leaving
// root. EXDEV: it would have left it.
func OpenBeneath(root int, rel string) (int, error) {
	if rel == "." {
		return unix.Openat(root, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	for range 16 {
		fd, err := unix.Openat2(root, rel, &how)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue // a rename or mount raced the walk: the kernel asks for a retry
		case errors.Is(err, unix.ENOSYS):
			return OpenNoFollow(root, rel)
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}

// OpenNoFollow is openBeneath without openat2: one component at a time,
// refusing every symlink.
func OpenNoFollow(root int, rel string) (int, error) {
	fd, err := unix.Openat(root, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(rel, "/") {
		if c == ".." { // rel is clean and local: never, but never followed either
			unix.Close(fd)
			return -1, unix.EXDEV
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// OpenDirBeneath opens directory dir, which must be root or below it
// (absolute paths), resolving it beneath root as the shim resolves a
// Spec.Dir confined by Spec.DirRoot, as the calling process's user. The
// file is an O_PATH descriptor (Stat and Fd only). An error wrapping
// unix.EXDEV means dir resolves outside root; ErrInvalid that dir is not
// below root at all.
func OpenDirBeneath(root, dir string) (*os.File, error) {
	return OpenDirBeneathAs(root, dir, func(open func() error) error { return open() })
}

// OpenDirBeneathAs is OpenDirBeneath with the resolution below the root
// run by as (the calling thread, or a thread with a user's identity:
// openDirBeneathAs); the root itself is opened by the caller's identity.
func OpenDirBeneathAs(root, dir string, as func(open func() error) error) (*os.File, error) {
	rel, ok := RelBelow(root, dir)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not %q or below it", ErrInvalid, dir, root)
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rfd)
	fd := -1
	if err := as(func() (err error) { fd, err = OpenBeneath(rfd, rel); return err }); err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return os.NewFile(uintptr(fd), dir), nil
}
