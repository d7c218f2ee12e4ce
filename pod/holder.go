package pod

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/seccomp"
	"golang.org/x/sys/unix"
)

// The holder's side (HolderMain). Protocol with Create, on a socket pair
// whose holder end is the holder's fd 3: Create writes one holderPlan as
// JSON and shuts its write side (after it placed the holder in the
// sandbox's cgroup v1 hierarchies, so the holder's cgroup namespace,
// made after it read the plan, is rooted there); the holder builds the
// pod and answers "ready\n", or "error STEP: ERR\n" and exits 1. The
// directories the caller gives are the holder's fds 4 and up: detached
// mounts the caller cloned with open_tree(2) (as root, never through a
// symlink), which the holder attaches in its own mount namespace. The
// holder, an unprivileged uid outside, reaches them only through those,
// never by a path whose directories it could not pass.

const (
	holderFD = 3
	// WorkspacePath is where the workspace is inside every pod: a short
	// top-level name, absent from every Debian root, that a workload can
	// hard-code (Codespaces and Gitpod use /workspaces, /workspace).
	WorkspacePath = "/workspace"
)

// DefaultSystemDirs are the host directories a pod's root shows when no
// root file system is named: each one that is a directory becomes the
// lower layer of an overlay at the same path; one that is a symlink
// (merged /usr: /bin -> usr/bin) is the same symlink; a missing one is
// left out. /lib* means every /lib, /lib32, /lib64, /libx32 there is.
// The /var parts are what dpkg and apt keep (what is installed, the
// package lists and archives, debconf's answers): root inside installs
// packages against the host's, its changes landing in its upper layer.
// The rest of /var is the pod's own (the root overlay's upper layer):
// the host's /var/lib (runnerd's state may be there), /var/log (the
// host's logs) and /var/cache are not shown. Every one but /usr, /bin,
// /sbin and /lib* is masked (what the pod's ids could not read without
// the idmap is not there: /etc/shadow, private keys, debconf's
// passwords.dat).
var DefaultSystemDirs = []string{"/usr", "/bin", "/sbin", "/lib*", "/etc",
	"/var/lib/dpkg", "/var/lib/apt", "/var/cache/apt", "/var/cache/debconf"}

// holderPlan is what the holder builds, sent by Create as JSON.
type holderPlan struct {
	Hostname string `json:"hostname"`
	// SystemDirs: absolute host directories, already expanded (no *).
	SystemDirs []string `json:"system_dirs,omitempty"`
	// Idmapped: per system directory, the index among the descriptors
	// sent with the plan of its idmapped clone, or -1 (used as it is).
	Idmapped []int `json:"idmapped,omitempty"`
	// Masked: per system directory, whether its overlay gets a mask
	// layer (maskLayer).
	Masked []bool `json:"masked,omitempty"`
	// Binds: the binds, their sources at bindStage/Stage when the holder
	// starts (stageBinds), set up (read-only, nosuid, nodev) by Create.
	Binds []planBind `json:"binds,omitempty"`
	// Seccomp: the filter the holder loads (seccomp.Filter.MarshalBinary);
	// empty: it compiles seccomp.Default.
	Seccomp []byte `json:"seccomp,omitempty"`
	// Rootfs: the index among the descriptors sent with the plan of an
	// operator-named root file system directory's idmapped clone (-1:
	// none; SystemDirs then).
	Rootfs    int  `json:"rootfs"`
	Upper     int  `json:"upper"`
	Workspace int  `json:"workspace"`
	Tmp       int  `json:"tmp"`
	VarTmp    int  `json:"var_tmp"`
	CgroupNS  bool `json:"cgroup_ns"`
}

// planBind is one bind of the plan.
type planBind struct {
	Stage  int    `json:"stage"`
	Target string `json:"target"`
	Dir    bool   `json:"dir"`
}

// HolderMain is the holder's entry point, the shim program's `pod` mode
// (`runner-shim pod`, `runnerd shim pod`): Create starts it; it is never
// run by hand. It returns only on failure, with the exit status.
func HolderMain(args []string) int {
	if len(args) != 0 {
		fmt.Fprintln(os.Stderr, "pod: the holder takes no arguments (it is started by pod.Create)")
		return 2
	}
	// unshare(CLONE_NEWCGROUP) is per thread until the runtime's next
	// clone: one locked thread does every step.
	runtime.LockOSThread()
	unix.CloseOnExec(holderFD)
	conn := os.NewFile(holderFD, "pod")
	// Before anything else: pid 1 of its namespace, killed by any signal
	// it has a handler for (Go installs one for most of them, and dies on
	// SIGTERM), so every signal a process inside could send is ignored.
	// SIGKILL and SIGSTOP from inside never reach an init; from the host
	// SIGKILL ends the pod (Destroy).
	ignoreSignals()
	var p holderPlan
	lowers, err := recvPlan(&p)
	if err != nil {
		fmt.Fprintf(conn, "error read plan: %v\n", err)
		return 1
	}
	if step, err := build(&p, lowers); err != nil {
		fmt.Fprintf(conn, "error %s: %v\n", step, err)
		return 1
	}
	// Root inside may ptrace the holder (it holds CAP_SYS_PTRACE in the
	// holder's user namespace, and the holder's memory belongs to it):
	// code it injects there must meet the same filter as its own, or the
	// holder would make for it the calls the filter denies it (an
	// unshare, a mount: TestPodHolderFiltered).
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(conn, "error set no_new_privs: %v\n", err)
		return 1
	}
	if f, err := holderFilter(p.Seccomp); err != nil {
		fmt.Fprintf(conn, "error build the seccomp filter: %v\n", err)
		return 1
	} else if err := f.Load(); err != nil {
		fmt.Fprintf(conn, "error load the seccomp filter: %v\n", err)
		return 1
	}
	// Ready: from here the holder holds nothing of the host's.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	if _, err := io.WriteString(conn, "ready\n"); err != nil {
		return 1 // Create gave up on it; it kills it too
	}
	conn.Close()
	// The caller's directories, attached or not: the holder keeps no
	// descriptor of the host's (never a range: the runtime's own are
	// among them).
	for _, fd := range append(lowers, 4+p.Upper, 4+p.Workspace, 4+p.Tmp, 4+p.VarTmp) {
		unix.Close(fd)
	}
	for {
		reapAll()
		<-chld
	}
}

// holderFilter is the filter the plan carries, decoded (Create checked
// it), or Default compiled when it carries none.
func holderFilter(b []byte) (*seccomp.Filter, error) {
	if len(b) > 0 {
		return seccomp.Decode(b)
	}
	return seccomp.Default()
}

// ignoreSignals ignores every signal but SIGKILL, SIGSTOP (which cannot
// be), SIGCHLD (reaped) and the two the Go runtime needs (SIGURG for
// preemption, SIGPROF for profiling; a user-sent one is dropped by the
// runtime's handler).
func ignoreSignals() {
	for s := syscall.Signal(1); s <= 64; s++ {
		switch s {
		case unix.SIGKILL, unix.SIGSTOP, unix.SIGCHLD, unix.SIGURG, unix.SIGPROF:
			continue
		}
		signal.Ignore(s)
	}
}

// recvPlan reads the plan (JSON, to EOF) from fd 3 and the descriptors
// sent with it: the idmapped lower layers, in SystemDirs' order.
func recvPlan(p *holderPlan) ([]int, error) {
	var data []byte
	var fds []int
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(64*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(holderFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return nil, err
			}
			for i := range msgs {
				r, err := unix.ParseUnixRights(&msgs[i])
				if err != nil {
					return nil, err
				}
				fds = append(fds, r...)
			}
		}
		if n == 0 && oobn == 0 {
			break
		}
		data = append(data, buf[:n]...)
	}
	return fds, json.Unmarshal(data, p)
}

// reapAll reaps every child that has exited, without blocking.
func reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}

func fdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// build makes the pod's root and pivots into it; it returns the failed
// step with the error.
func build(p *holderPlan, lowers []int) (string, error) {
	fd := func(i int) int { return 4 + i }
	if p.CgroupNS {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return "unshare cgroup namespace", err
		}
	}
	if err := unix.Sethostname([]byte(p.Hostname)); err != nil {
		return "set host name", err
	}
	// Nothing mounted here may propagate anywhere (the mount namespace
	// of a new user namespace gets slave copies already; private is
	// what is meant).
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return "make mounts private", err
	}
	// The binds' sources, before the staging tmpfs covers bindStage:
	// clones of the locked copies (bindInto).
	bindFDs := make([]int, len(p.Binds))
	for i, b := range p.Binds {
		fd, err := unix.OpenTree(unix.AT_FDCWD, bindStage+"/"+strconv.Itoa(b.Stage), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return "take bind " + b.Target, err
		}
		defer unix.Close(fd)
		bindFDs[i] = fd
	}
	// The staging area, as bubblewrap does: a tmpfs of the holder's own
	// over /tmp (the host's /tmp is not touched: this is the holder's
	// mount namespace), holding the root's mount point and the skeleton
	// the root overlay's lower layer is.
	if err := unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return "mount staging tmpfs", err
	}
	const newRoot, skel = "/tmp/root", "/tmp/skel"
	for _, d := range []string{newRoot, skel} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "make " + d, err
		}
	}
	// The caller's directories arrive as detached mounts (open_tree
	// clones made in the caller's mount namespace): a path through a
	// descriptor of the caller's namespace is refused as an overlay
	// layer or a bind source here (EINVAL), so each is attached in the
	// staging area first, and used by that path.
	staged := map[int]string{}
	for name, i := range map[string]int{"upper": p.Upper, "workspace": p.Workspace, "tmp": p.Tmp, "var-tmp": p.VarTmp} {
		dir := "/tmp/" + name
		if err := os.Mkdir(dir, 0o755); err != nil {
			return "make " + dir, err
		}
		if err := unix.MoveMount(fd(i), "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "attach the " + name + " directory", err
		}
		staged[i] = dir
	}
	up := staged[p.Upper]
	if p.Rootfs >= 0 {
		if p.Rootfs >= len(lowers) {
			return "attach the root file system", unix.EBADF
		}
		if err := unix.MoveMount(lowers[p.Rootfs], "", unix.AT_FDCWD, skel, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "attach the root file system", err
		}
		if err := overlay(skel, up, "root", newRoot); err != nil {
			return "mount root overlay", err
		}
	} else {
		// The skeleton: every mount point, and the system directories'
		// symlinks. Empty directories: what lands in them is the upper
		// layer's (persistent) or a mount's.
		for _, d := range []string{"proc", "dev", "tmp", "var", "var/tmp", "var/lib", "var/cache", "var/log", "var/log/apt", "run", "root", "home", "mnt", "opt", "srv", WorkspacePath[1:]} {
			if err := os.MkdirAll(path.Join(skel, d), 0o755); err != nil {
				return "make skeleton", err
			}
		}
		os.Chmod(path.Join(skel, "tmp"), 0o1777)
		os.Chmod(path.Join(skel, "var/tmp"), 0o1777)
		os.Chmod(path.Join(skel, "root"), 0o700)
		var dirs, lowerOf []string
		for i, d := range p.SystemDirs {
			fi, err := os.Lstat(d)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return "stat " + d, err
			}
			if fi.Mode()&os.ModeSymlink != 0 {
				to, err := os.Readlink(d)
				if err != nil {
					return "read link " + d, err
				}
				if err := os.MkdirAll(path.Dir(path.Join(skel, d)), 0o755); err != nil {
					return "make skeleton", err
				}
				if err := os.Symlink(to, path.Join(skel, d)); err != nil {
					return "make skeleton link " + d, err
				}
				continue
			}
			if err := os.MkdirAll(path.Join(skel, d), 0o755); err != nil {
				return "make skeleton", err
			}
			lower := d
			if i < len(p.Idmapped) && p.Idmapped[i] >= 0 {
				j := p.Idmapped[i]
				if j >= len(lowers) {
					return "attach the lower layer of " + d, unix.EBADF
				}
				// The host's files seen with the pod's ids (its root's are
				// the pod's root's), read-only: root inside may change
				// them, by a copy-up into the upper layer, and the copy
				// keeps that owner.
				lower = "/tmp/lower" + strconv.Itoa(i)
				if err := os.Mkdir(lower, 0o755); err != nil {
					return "make " + lower, err
				}
				if err := unix.MoveMount(lowers[j], "", unix.AT_FDCWD, lower, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
					return "attach the lower layer of " + d, err
				}
				if i < len(p.Masked) && p.Masked[i] {
					if unix.Faccessat(unix.AT_FDCWD, d, unix.R_OK|unix.X_OK, 0) != nil {
						continue // not the pod's to read at all: left out
					}
					mask := "/tmp/mask" + strconv.Itoa(i)
					if err := maskLayer(d, lower, mask); err != nil {
						return "mask " + d, err
					}
					lower = mask + ":" + lower
				}
			}
			dirs, lowerOf = append(dirs, d), append(lowerOf, lower)
		}
		if err := overlay(skel, up, "root", newRoot); err != nil {
			return "mount root overlay", err
		}
		for i, d := range dirs {
			t, err := target(newRoot, d)
			if err != nil {
				return "open mount point " + d, err
			}
			err = overlay(lowerOf[i], up, url.PathEscape(strings.TrimPrefix(d, "/")), t.name())
			t.close()
			if err != nil {
				return "mount overlay of " + d, err
			}
		}
	}
	if step, err := mountSpecial(p, newRoot, staged); err != nil {
		return step, err
	}
	if err := podHosts(newRoot, up, p.Hostname); err != nil {
		return "write /etc/hosts", err
	}
	for i, b := range p.Binds {
		if err := bindInto(newRoot, b, bindFDs[i]); err != nil {
			return "bind " + b.Target, err
		}
	}
	// pivot_root(".", "."), then detach the old root stacked under the
	// new one: no directory is needed for it, and the host's tree is gone
	// from the namespace (runc's and bubblewrap's way).
	if err := unix.Chdir(newRoot); err != nil {
		return "enter new root", err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return "pivot_root", err
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return "detach old root", err
	}
	if err := unix.Chdir("/"); err != nil {
		return "chdir /", err
	}
	// Not traceable, and its /proc files root's of the user namespace
	// only, by a process of the pod that is not root.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return "set not dumpable", err
	}
	return "", nil
}

// overlay mounts an overlay at target whose lower layer is lower and
// whose upper and work directories are NAME/upper and NAME/work in the
// directory up (made here when missing: a pod made again at resume finds
// its layers).
func overlay(lower, up, name, target string) error {
	dir := path.Join(up, name)
	for _, d := range []string{dir, dir + "/upper", dir + "/work"} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work,userxattr", lower, dir, dir)
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay %s: %w", opts, err)
	}
	return nil
}

// mountPoint is a mount point opened beneath the new root.
type mountPoint struct{ fd int }

func (m mountPoint) name() string { return fdPath(m.fd) }
func (m mountPoint) close()       { unix.Close(m.fd) }

// target opens rel (an absolute path inside the pod) beneath root
// without following any symlink: the upper layer is the sandbox's own,
// and a link it planted where a mount point is expected (from an earlier
// incarnation) must not move the mount; such a pod fails to start.
func target(root, rel string) (mountPoint, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return mountPoint{}, err
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	// One element at a time: one that is missing (a root file system
	// without this mount point) is made, in its parent opened the same
	// way; the upper layer gets it.
	fd, err := unix.Dup(rfd)
	if err != nil {
		return mountPoint{}, err
	}
	for _, name := range strings.Split(strings.Trim(rel, "/"), "/") {
		next, err := unix.Openat2(fd, name, how)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(fd, name, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat2(fd, name, how)
			}
		}
		unix.Close(fd)
		if err != nil {
			return mountPoint{}, err
		}
		fd = next
	}
	return mountPoint{fd}, nil
}

// mountAt mounts (or binds, with source a path) at rel beneath root.
func mountAt(root, rel, source, fstype string, flags uintptr, data string) error {
	t, err := target(root, rel)
	if err != nil {
		return fmt.Errorf("open mount point %s: %w", rel, err)
	}
	defer t.close()
	if err := unix.Mount(source, t.name(), fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", source, rel, err)
	}
	return nil
}

// bindAt bind-mounts source at rel, nosuid and nodev (read-only with ro).
func bindAt(root, rel, source string, ro bool) error {
	if err := mountAt(root, rel, source, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	fl := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if ro {
		fl |= unix.MS_RDONLY
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path.Join(root, rel), &sfs); err != nil {
		return err
	}
	if sfs.Flags&unix.ST_NOEXEC != 0 {
		fl |= unix.MS_NOEXEC
	}
	return mountAt(root, rel, "", "", fl, "")
}

// devices are the nodes of a pod's /dev, bound from the host's (a user
// namespace cannot mknod).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// mountSpecial mounts /proc, /dev, /dev/shm, /run/lock, /tmp, /var/tmp
// and the workspace in the new root.
func mountSpecial(p *holderPlan, root string, staged map[int]string) (string, error) {
	nsd := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if err := mountAt(root, "/proc", "proc", "proc", nsd|unix.MS_NOEXEC, ""); err != nil {
		return "mount /proc", err
	}
	if err := mountAt(root, "/dev", "tmpfs", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return "mount /dev", err
	}
	dev := path.Join(root, "dev")
	for _, d := range devices {
		f, err := os.OpenFile(path.Join(dev, d), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err != nil {
			return "make /dev/" + d, err
		}
		f.Close()
		if err := mountAt(root, "/dev/"+d, "/dev/"+d, "", unix.MS_BIND, ""); err != nil {
			return "bind /dev/" + d, err
		}
	}
	for _, l := range [][2]string{{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
		{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"}} {
		if err := os.Symlink(l[0], path.Join(dev, l[1])); err != nil {
			return "make /dev/" + l[1], err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(path.Join(dev, d), 0o755); err != nil {
			return "make /dev/" + d, err
		}
	}
	// A devpts instance of the pod's own: its ptys are not the host's.
	// Not nodev: its ptmx is the device a pty is opened through (with
	// nodev every posix_openpt fails EACCES: no script, tmux, expect);
	// it holds nothing but the pod's own ptys.
	if err := mountAt(root, "/dev/pts", "devpts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return "mount /dev/pts", err
	}
	// A fresh /run (the host's holds its daemons' sockets and state):
	// memory, counted in the sandbox's cgroup as /dev/shm is.
	if err := mountAt(root, "/run", "tmpfs", "tmpfs", nsd, "mode=0755"); err != nil {
		return "mount /run", err
	}
	for _, d := range []string{"/dev/shm", "/run/lock"} {
		if err := mountAt(root, d, "tmpfs", "tmpfs", nsd, "mode=1777"); err != nil {
			return "mount " + d, err
		}
	}
	for _, b := range []struct {
		rel string
		i   int
	}{{"/tmp", p.Tmp}, {"/var/tmp", p.VarTmp}, {WorkspacePath, p.Workspace}} {
		if err := bindAt(root, b.rel, staged[b.i], false); err != nil {
			return "bind " + b.rel, err
		}
	}
	return "", nil
}
