package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/agentrunner/runner/internal/netnsstart"
	"github.com/agentrunner/runner/seccomp"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// The exec path's steps (execSteps in exec.go), one function each.

func joinCgroupV2(p *execPlan, f *forkSetup) error {
	fd, err := unix.Open(p.CgroupV2, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", p.CgroupV2, err)
	}
	f.closers = append(f.closers, os.NewFile(uintptr(fd), p.CgroupV2))
	f.cmd.SysProcAttr.UseCgroupFD, f.cmd.SysProcAttr.CgroupFD = true, fd
	return nil
}

// joinCgroupV2Ahead moves the helper started ahead, the whole process,
// into the v2 directory: a v2 domain cgroup takes processes, not threads.
func joinCgroupV2Ahead(dir string) (string, error) {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return "nsexec: join cgroup " + dir, proto.UnwrapPath(err)
	}
	return "", nil
}

// joinCgroups moves the calling thread (the helper's locked thread, the
// one that execs the command) into each of dirs, v1 hierarchies all, by
// writing "0" (this thread) to their tasks files.
//
// Why the thread and not the process (cgroup.procs): a process's
// migration takes the kernel's global cgroup_threadgroup_rwsem for
// writing, whose per-CPU rwsem waits an RCU grace period when it has been
// idle a while (docs/cgroups.md: 7-14 ms for a
// spawn that comes after a pause) and waits behind every fork and exit on
// the host (100-450 ms under a fork bomb in another sandbox); since Linux
// 6.2 ("cgroup: Optimize single thread migration") the migration of the
// calling thread by "0" takes no such lock. Measured on this 6.18 host,
// four hierarchies, 100 ms between moves: 13.1 ms (5.9-18.8) p50 for
// cgroup.procs, 0.32 ms (0.24-0.55) for "0" to tasks. Older kernels take
// the lock either way. The helper's other threads (the Go runtime's)
// stay where the helper started, charged to no sandbox, and execve(2)
// ends them: the command is the one thread that moved, its new mm
// charged to the memory cgroup of the thread that execs.
func joinCgroups(dirs []string) (string, error) {
	self := []byte("0")
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "tasks"), self, 0); err != nil {
			return "nsexec: join cgroup " + dir, proto.UnwrapPath(err)
		}
	}
	return "", nil
}

// enterNetNS is the network namespace step of a helper started ahead: the
// calling thread (locked, the one that execs) enters p.NetNS, proven as
// netnsstart.Start proves it before a fork.
func enterNetNS(p *execPlan) (string, error) {
	ns, err := os.Open(p.NetNS)
	if err != nil {
		return "nsexec: open netns " + p.NetNS, proto.UnwrapPath(err)
	}
	defer ns.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		return "nsexec: enter netns " + p.NetNS, err
	}
	if err := netnsstart.Same(ns, unix.Gettid()); err != nil {
		return "nsexec: enter netns " + p.NetNS, err
	}
	return "", nil
}

// keptBounding is the bounding set an Isolate command keeps (step 5):
// CAP_NET_RAW alone, which no_new_privs keeps it from ever holding.
const keptBounding = 1 << unix.CAP_NET_RAW

func dropBoundingSet(*execPlan) (string, error) {
	// Every capability the kernel knows: PR_CAPBSET_DROP answers EINVAL
	// past the last one (as libcap's cap_drop_bound loop relies on).
	for c := 0; c < 64; c++ {
		if keptBounding&(1<<c) != 0 {
			continue
		}
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			return "", nil
		}
		if err != nil {
			return fmt.Sprintf("nsexec: drop capability %d from the bounding set", c), err
		}
	}
	return "", nil
}

// openDir is the helper's first half of step 9: DirRoot opened as root
// (O_PATH: no permission on the directory itself is used), for enterDir.
// Never Dir itself: root would follow whatever symlinks lie on its path
// (beneath.go); without a DirRoot, enterDir chdirs as the user.
func openDir(p *execPlan) (string, error) {
	fd, err := unix.Open(p.DirRoot, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "chdir " + p.Dir, err // as the chdir itself would report it
	}
	p.dirFD = fd
	return "", nil
}

func switchUser(p *execPlan) (string, error) {
	c := p.Cred
	groups := make([]int, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return "nsexec: setgroups", err
	}
	if err := syscall.Setgid(int(c.GID)); err != nil {
		return "nsexec: setgid", err
	}
	if err := syscall.Setuid(int(c.UID)); err != nil {
		return "nsexec: setuid", err
	}
	return "", nil
}

// enterDir is the helper's chdir step, as the user: with DirRoot, Dir
// resolved beneath the root openDir opened before the switch and entered
// with fchdir(2) (the search permission of the root and of each
// directory below it is checked, nothing above it); else chdir(2).
func enterDir(p *execPlan) (string, error) {
	if p.DirRoot != "" && p.dirFD > 0 {
		// As the user now: each directory below the root must let it pass.
		rel, ok := sessiondir.RelBelow(p.DirRoot, p.Dir)
		if !ok { // validate refused it
			return sessiondir.DirOutside(p.Dir, p.DirRoot), unix.EXDEV
		}
		fd, err := sessiondir.OpenBeneath(p.dirFD, rel)
		if errors.Is(err, unix.EXDEV) {
			return sessiondir.DirOutside(p.Dir, p.DirRoot), err
		}
		if err != nil {
			return "chdir " + p.Dir, err
		}
		defer unix.Close(fd)
		return "chdir " + p.Dir, unix.Fchdir(fd)
	}
	return "chdir " + p.Dir, unix.Chdir(p.Dir)
}

// forkDir is step 9 on the direct path: exec.Cmd's chdir in the child,
// after the user switch; with DirRoot, into the directory the shim
// resolved beneath it (the root opened as the shim, the rest as the
// command's user, lookas.go), by its descriptor, which the child holds
// until its execve.
func forkDir(p *execPlan, f *forkSetup) error {
	if p.DirRoot == "" {
		f.cmd.Dir = p.Dir
		return nil
	}
	d, err := openDirBeneathAs(p.Cred, p.DirRoot, p.Dir)
	if errors.Is(err, unix.EXDEV) {
		return &proto.CommandError{Err: fmt.Errorf("%s: %w", sessiondir.DirOutside(p.Dir, p.DirRoot), unix.EXDEV)}
	}
	if err != nil {
		return &proto.CommandError{Err: fmt.Errorf("chdir %s: %w", p.Dir, proto.UnwrapPath(err))}
	}
	f.closers = append(f.closers, d)
	f.cmd.Dir = "/proc/self/fd/" + strconv.Itoa(int(d.Fd()))
	return nil
}

func clearCaps(*execPlan) (string, error) {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return "nsexec: clear ambient capabilities", err
	}
	// This thread's sets (capabilities are per thread, and this is the
	// thread that execs).
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return "nsexec: read capabilities", err
	}
	for i := range data {
		data[i].Inheritable = 0
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return "nsexec: clear inheritable capabilities", err
	}
	return "", nil
}

// loadSeccomp installs the isolated command's system-call filter on the
// helper, whose execve passes it on to the command: the program the shim
// compiled (p.Seccomp), checked and installed as it came, never compiled
// here. A plan without one, or with one not intact (seccomp.Decode:
// length, version, architecture, checksum), fails the start: the command
// never runs unfiltered, nor under a filter other than the one compiled.
func loadSeccomp(p *execPlan) (string, error) {
	if len(p.Seccomp) == 0 {
		return "nsexec: the plan carries no seccomp program", seccomp.ErrCorrupt
	}
	f, err := seccomp.Decode(p.Seccomp)
	if err != nil {
		return "nsexec: check the seccomp program", err
	}
	return "nsexec: load the seccomp filter", f.Load()
}
