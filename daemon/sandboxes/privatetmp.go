package sandboxes

// Private /tmp, /var/tmp and /dev/shm of isolated sandboxes.
//
// Each isolated sandbox incarnation gets a directory of its own,
// STATE/private/ID (ID as NetID: name and incarnation), holding tmp,
// var-tmp and shm (01777). Every command of the sandbox sees them as
// /tmp, /var/tmp and /dev/shm (sessiondir.Spec.Binds: bind mounts in the
// command's own mount namespace), so no sandbox sees another's or the
// host's files there. STATE/private is 0700: no command reaches another
// sandbox's through the host's path. They live on the state directory's
// disk, not in RAM (a /dev/shm file is a disk file's pages, reclaimable,
// not pinned in host memory), survive park, resume and runnerd restarts,
// and destroy removes them once no process of the sandbox is left. A
// tmpfs per sandbox (its pages charged to the sandbox's memory cgroup)
// would bound them by the memory limit, at the price of a host mount per
// sandbox that outlives a runnerd stopped with sandboxes: not done. Where
// the sandbox has a volume (disk.go) they live on it, VOL/private/ID, and
// count in its disk budget.
// One of the three that holds runnerd's state directory stays the host's
// (its workspaces would vanish behind the private one): runnerd says so
// at start.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// privateTmps are the sandbox's private directories: the subdirectory of
// its private directory, and the path its commands see it at.
var privateTmps = []sessiondir.Bind{{Source: "tmp", Target: "/tmp"}, {Source: "var-tmp", Target: "/var/tmp"}, {Source: "shm", Target: "/dev/shm"}}

// privateTargets returns privateTmps without those holding state (a
// test's, or an operator's state under /tmp), and those it left out.
func privateTargets(state string) (kept []sessiondir.Bind, shared []string) {
	for _, b := range privateTmps {
		if state == b.Target || strings.HasPrefix(state, b.Target+"/") {
			shared = append(shared, b.Target)
			continue
		}
		kept = append(kept, b)
	}
	return kept, shared
}

// privateTmpDir is the directory holding sb's private directories: on
// its volume (VOL/private/ID, counted in its disk budget) when it has
// one (disk.go), else under STATE/private.
func (s *Manager) privateTmpDir(sb registry.Sandbox) string {
	if s.hasVolume(sb) {
		return filepath.Join(filepath.Dir(sb.Workspace), "private", NetID(sb.Name, sb.Incarnation))
	}
	return filepath.Join(s.cfg.StateDir, "private", NetID(sb.Name, sb.Incarnation))
}

// ensurePrivateTmp makes sb's private directories unless they exist.
// Idempotent; the caller holds sb's lock. Create makes them, so
// a command on a full disk later needs no inode for them; a spawn makes
// them for a sandbox created before they existed. A full disk is 507
// write_failed with retry_after_ms (errNoSpace), like every write.
func (s *Manager) ensurePrivateTmp(sb registry.Sandbox) (string, error) {
	dir, err := s.makePrivateTmp(sb)
	if err != nil && apierr.IsNoSpace(err) {
		return "", apierr.NoSpace("create private /tmp", err)
	}
	if err != nil {
		return "", apierr.Unavailable("create private /tmp: %v", err)
	}
	return dir, nil
}

func (s *Manager) makePrivateTmp(sb registry.Sandbox) (string, error) {
	dir := s.privateTmpDir(sb)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(filepath.Dir(dir), 0o700); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// Root never follows a link here: each directory is made and chmod'ed
	// (01777) through descriptors opened with O_NOFOLLOW, so a link in
	// place of one (no sandbox can make one: dir is root's) fails instead
	// of opening its target to everyone.
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	for _, b := range privateTmps {
		if err := unix.Mkdirat(dfd, b.Source, 0o777); err != nil && !errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("%s: mkdir: %w", b.Target, err)
		}
		fd, err := unix.Openat(dfd, b.Source, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("%s: open %s: %w", b.Target, filepath.Join(dir, b.Source), err)
		}
		err = unix.Fchmod(fd, 0o777|unix.S_ISVTX) // Mkdirat's mode passes the umask
		unix.Close(fd)
		if err != nil {
			return "", fmt.Errorf("%s: chmod: %w", b.Target, err)
		}
	}
	if err := writeUserFiles(sb, dir); err != nil { // passwdfiles.go
		return "", err
	}
	return dir, nil
}

// removePrivateTmp removes sb's private directories (absent is success).
// It runs once no process of the sandbox is left.
func (s *Manager) removePrivateTmp(sb registry.Sandbox) error {
	if err := os.RemoveAll(s.privateTmpDir(sb)); err != nil {
		return apierr.Unavailable("remove private tmp of sandbox %q: %v", sb.Name, err)
	}
	return nil
}

// PrivateBinds returns the binds of an isolated sandbox's command: its
// private directories over their targets, and its copies of the user
// database (passwdfiles.go); none for a sandbox that is not isolated.
func (s *Manager) PrivateBinds(sb registry.Sandbox) ([]sessiondir.Bind, error) {
	if !s.Isolated(sb) || !s.ids.enabled {
		return nil, nil
	}
	dir, err := s.ensurePrivateTmp(sb)
	if err != nil {
		return nil, err
	}
	kept, _ := privateTargets(s.cfg.StateDir)
	binds := make([]sessiondir.Bind, len(kept))
	for i, b := range kept {
		binds[i] = sessiondir.Bind{Source: filepath.Join(dir, b.Source), Target: b.Target}
	}
	return append(binds, userBinds(sb, dir)...), nil
}

// sharedTmps are the private directories runnerd leaves the host's
// because they hold state.
func sharedTmps(state string) []string {
	_, shared := privateTargets(state)
	return shared
}
