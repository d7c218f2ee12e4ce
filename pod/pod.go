package pod

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/internal/netnsstart"
	"github.com/agentrunner/runner/seccomp"
	"golang.org/x/sys/unix"
)

// Errors, matched with errors.Is.
var (
	// ErrInvalid is returned by Create for a Config it cannot hold.
	ErrInvalid = errors.New("invalid pod config")
	// ErrGone is returned by Adopt when pid is not the holder it names
	// (it exited, or the pid was reused).
	ErrGone = errors.New("pod holder gone")
)

// Config is what Create makes a pod of. The directories are the
// caller's, made by it in directories only root can change; Create
// opens each (never through a symlink) and hands it to the holder.
type Config struct {
	// Holder is the argv of the holder: the shim program and its `pod`
	// mode (runnerd: {exe, "shim", "pod"}; runner-shim: {exe, "pod"}).
	Holder []string
	// Env is the holder's environment (nil: none). A test binary that
	// is its own holder program selects that with a variable here.
	Env []string
	// Name is the pod's host name (the sandbox's name): 1-64 bytes of
	// [A-Za-z0-9.-].
	Name string
	// UIDBase is the first id of the pod's subordinate block (Ranges):
	// uid and gid 0..BlockSize-1 inside are UIDBase.. outside.
	UIDBase uint32
	// Upper holds the pod's writable layers (NAME/upper, NAME/work per
	// overlay): what root inside writes to /usr/local, /etc, /root, /var
	// lands there, owned by ids of the block. Workspace is bound at
	// WorkspacePath, Tmp at /tmp and VarTmp at /var/tmp. Create gives the
	// four directories (not their contents) to the block's root
	// (UIDBase), Tmp and VarTmp mode 01777.
	Upper, Workspace, Tmp, VarTmp string
	// Rootfs optionally names a root file system directory (an unpacked
	// image) as the root overlay's lower layer; empty: the host's
	// SystemDirs.
	Rootfs string
	// SystemDirs are the host directories the root shows when Rootfs is
	// empty (nil: DefaultSystemDirs). Absolute, clean, no ',' or ':'
	// (overlay's option syntax); a trailing * globs the last element.
	SystemDirs []string
	// NetNS optionally names the network namespace file the holder (and
	// every session that joins it) lives in; empty: the caller's.
	NetNS string
	// Cgroups optionally names the sandbox's cgroup directories: with
	// cgroup v2 one unified directory, the holder is cloned into it;
	// with v1 or hybrid one per hierarchy, Create writes the holder into
	// each before the holder makes its cgroup namespace. The holder's
	// cgroup namespace is rooted where it then is (with none, where the
	// caller is).
	Cgroups []string
	// ResolvConf optionally names a host file bound read-only at
	// /etc/resolv.conf in the pod (runnerd: the sandbox's resolver file
	// when it is contained, the host's /etc/resolv.conf otherwise). It is
	// root's path and is followed if it is a symlink (the host's
	// /etc/resolv.conf commonly links into /run); empty: the pod's /etc
	// shows the host's file, changeable by root inside in its upper layer.
	ResolvConf string
	// Binds are host paths bound into the pod (an operator's binds: into
	// every sandbox or one), read-only unless Writable.
	Binds []Bind
	// Seccomp optionally holds the filter the holder loads on itself once
	// the pod is built (seccomp.Filter.MarshalBinary: runnerd's launcher
	// compiles it once); nil: the holder compiles seccomp.Default itself.
	// Bytes that do not decode fail the Create: the holder never runs
	// unfiltered.
	Seccomp []byte
}

// Bind is a host path bound into a pod. Source is opened by Create as
// root, never through a symlink at its last element, and handed to the
// holder as a detached mount of that file or directory alone (what is
// mounted below a directory is not carried); Target is an absolute,
// clean path inside the pod, its mount point made inside the pod's root
// (never outside it: no symlink is followed), and may not be /, nor lie
// in /proc, /dev, /tmp, /var/tmp or the workspace (the pod's own mounts).
// A bind is nosuid and nodev, and read-only unless Writable: the kernel
// holds that (MOUNT_ATTR_RDONLY on the mount, set by Create before the
// holder gets it, and locked in the pod: stageBinds), and the pod's
// seccomp filter refuses every mount call besides. Its files keep the
// host's ids (no idmap): a writable bind is writable where the host's
// permissions let the block's ids write.
type Bind struct {
	Source, Target string
	Writable       bool
}

// Pod is a running holder. Its methods are safe for concurrent use.
// Destroy (which ends the pod) or Release (which does not) frees its
// pidfd; both are idempotent, and the first of them is final.
type Pod struct {
	pid   int
	start uint64 // start time in clock ticks since boot (/proc/PID/stat field 22)
	pidfd int
	// child: the holder is this process's child (Create), which Destroy
	// reaps; an adopted one is reaped by whoever its parent now is.
	child bool
	done  chan struct{} // closed once Destroy finished
	mu    chan struct{} // a one-token lock: Destroy's
}

// PID is the holder's pid (in the caller's pid namespace).
func (p *Pod) PID() int { return p.pid }

// StartTime is the holder's start time (clock ticks since boot), with
// PID what a session's Spec names the pod by, and what Adopt checks.
func (p *Pod) StartTime() uint64 { return p.start }

// Create makes a pod and returns once its holder said ready. On any
// error nothing of it is left (the holder is killed and reaped).
func Create(ctx context.Context, cfg Config) (*Pod, error) {
	dirs, err := expandDirs(cfg)
	if err != nil {
		return nil, err
	}
	uc, child, err := socketPair()
	if err != nil {
		return nil, err
	}
	defer child.Close()
	defer uc.Close()
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	plan := holderPlan{Hostname: cfg.Name, SystemDirs: dirs, Rootfs: -1}
	for _, d := range []struct {
		path  string
		idx   *int
		chown bool
		mode  os.FileMode
	}{{cfg.Upper, &plan.Upper, true, 0o700}, {cfg.Workspace, &plan.Workspace, true, 0},
		{cfg.Tmp, &plan.Tmp, true, 0o1777}, {cfg.VarTmp, &plan.VarTmp, true, 0o1777}} {
		if d.path == "" {
			continue
		}
		f, err := openDir(d.path)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		*d.idx = len(files) - 1
		if d.chown {
			if err := unix.Fchownat(int(f.Fd()), "", int(cfg.UIDBase), int(cfg.UIDBase), unix.AT_EMPTY_PATH); err != nil {
				return nil, fmt.Errorf("give %s to the pod: %w", d.path, err)
			}
		}
		if d.mode != 0 {
			// chmod through /proc/self/fd: fchmod refuses an O_PATH fd.
			if err := os.Chmod(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), d.mode); err != nil {
				return nil, fmt.Errorf("chmod %s: %w", d.path, err)
			}
		}
	}
	binds := cfg.Binds
	if cfg.ResolvConf != "" {
		binds = append(binds[:len(binds):len(binds)], Bind{Source: cfg.ResolvConf, Target: "/etc/resolv.conf"})
	}
	var staged []stagedBind
	defer func() {
		for _, b := range staged {
			b.f.Close()
		}
	}()
	for i, b := range binds {
		follow := cfg.ResolvConf != "" && i == len(binds)-1
		f, dir, err := openBind(b, follow)
		if err != nil {
			return nil, err
		}
		staged = append(staged, stagedBind{f, dir})
		plan.Binds = append(plan.Binds, planBind{Stage: i, Target: b.Target, Dir: dir})
	}
	plan.Seccomp = cfg.Seccomp
	var v2 *os.File
	var v1 []string
	for _, dir := range cfg.Cgroups {
		var sfs unix.Statfs_t
		if err := unix.Statfs(dir, &sfs); err != nil {
			return nil, fmt.Errorf("%w: cgroup %s: %v", ErrInvalid, dir, err)
		}
		if sfs.Type == unix.CGROUP2_SUPER_MAGIC {
			if v2 != nil {
				return nil, fmt.Errorf("%w: two cgroup v2 directories", ErrInvalid)
			}
			if v2, err = os.Open(dir); err != nil {
				return nil, fmt.Errorf("open cgroup %s: %w", dir, err)
			}
			defer v2.Close()
		} else {
			v1 = append(v1, dir)
		}
	}
	plan.CgroupNS = len(cfg.Cgroups) > 0

	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(cfg.UIDBase), Size: BlockSize}}
	attr := &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings: m, GidMappings: m,
		// setgroups stays allowed inside: the whole block is mapped by a
		// privileged parent, so dropping a group can reveal nothing the
		// block's root could not reach anyway (user_namespaces(7)).
		GidMappingsEnableSetgroups: true,
		Setsid:                     true,
		// uid and gid 0 of the namespace (the block's first id outside),
		// with its capabilities there: without it the holder is the
		// host's root unmapped, the overflow uid with none.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
	}
	if v2 != nil {
		attr.UseCgroupFD, attr.CgroupFD = true, int(v2.Fd())
	}
	// No stdin, stdout or stderr of the caller's (nil: /dev/null): root
	// inside may reach the holder's descriptors through /proc/1/fd (it
	// holds CAP_SYS_PTRACE in the holder's user namespace).
	// The holder's program is opened here, as the caller, and executed
	// through its descriptor: the child executes it as the block's root,
	// who may not pass the directories above it (a runnerd in a 0700
	// directory, as tests build it). The descriptor is close-on-exec.
	prog, err := os.OpenFile(cfg.Holder[0], unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open pod holder program: %w", err)
	}
	defer prog.Close()
	cmd := &exec.Cmd{Path: fmt.Sprintf("/proc/self/fd/%d", prog.Fd()), Args: cfg.Holder, Env: cfg.Env, SysProcAttr: attr,
		ExtraFiles: append([]*os.File{child}, files...)}
	start := netnsstart.Start
	if len(staged) > 0 {
		start = func(cmd *exec.Cmd, ns string) error { return netnsstart.StartWith(cmd, ns, stageBinds(staged)) }
	}
	if err := start(cmd, cfg.NetNS); err != nil {
		return nil, fmt.Errorf("start pod holder: %w", err)
	}
	child.Close()
	p, err := own(cmd.Process.Pid, true)
	cmd.Process.Release() // the pidfd below is the handle; Destroy reaps
	if err != nil {
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		var ws syscall.WaitStatus
		syscall.Wait4(cmd.Process.Pid, &ws, 0, nil)
		return nil, err
	}
	fail := func(err error) (*Pod, error) {
		p.Destroy(context.Background())
		return nil, err
	}
	for _, dir := range v1 {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(p.pid)), 0); err != nil {
			return fail(fmt.Errorf("place pod holder in %s: %w", dir, err))
		}
	}
	lowers, err := idmapLowers(p.pid, cfg.Rootfs, &plan)
	defer func() {
		for _, fd := range lowers {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return fail(err)
	}
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()
	b, _ := json.Marshal(plan)
	var oob []byte
	if len(lowers) > 0 {
		oob = unix.UnixRights(lowers...)
	}
	n, _, err := uc.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		_, err = uc.Write(b[n:])
	}
	if err != nil {
		return fail(fmt.Errorf("send pod plan: %w", err))
	}
	uc.CloseWrite()
	line, err := bufio.NewReader(uc).ReadString('\n')
	if line != "ready\n" {
		if ctx.Err() != nil {
			return fail(fmt.Errorf("make pod: %w", ctx.Err()))
		}
		if msg, ok := strings.CutPrefix(line, "error "); ok {
			return fail(fmt.Errorf("make pod: %s", strings.TrimSpace(msg)))
		}
		return fail(fmt.Errorf("make pod: holder said %q (%v)", line, err))
	}
	return p, nil
}

// masked reports whether the system directory dir is shown through a
// mask (holder.go, maskLayer): every one but the host's code (/usr,
// /bin, /sbin, /lib*), which is world-readable by convention and too big
// to walk at each start. The others (/etc, the /var parts, what an
// operator lists) hold the host's secrets (shadow, host keys, TLS keys,
// debconf's passwords) readable by its root alone; idmapped, they would
// be the pod's root's to read, so what the pod's ids could not read
// without the idmap is hidden.
func masked(dir string) bool {
	for _, code := range []string{"/usr", "/bin", "/sbin"} {
		if dir == code || strings.HasPrefix(dir, code+"/") {
			return false
		}
	}
	return !strings.HasPrefix(dir, "/lib")
}

// bindStage is where the holder finds the binds' sources when it starts:
// BINDSTAGE/N is bind N of the plan, mounted there in the mount namespace
// the holder's is copied from (stageBinds).
// Not /tmp, nor any directory a program lives in: the tmpfs covers it
// in the staging namespace the holder's program is executed from (a
// runnerd under /tmp, as tests run it, would not be found). An empty
// directory of the host's, made once.
const bindStage = "/run/runnerd-pod-binds"

// stagedBind is a bind's source as openBind made it.
type stagedBind struct {
	f   *os.File
	dir bool
}

// stageBinds returns what runs on the thread the holder is forked from,
// before the fork: it gives the thread a mount namespace of its own (a
// copy of the caller's, made private so nothing mounted in it reaches
// the host's), mounts a tmpfs at bindStage (0755: the holder, no one's
// id outside, passes it) and attaches each bind's source at
// bindStage/N. The holder's mount namespace, cloned from the thread's
// into the pod's user namespace, gets copies of those mounts whose flags
// the kernel locks there (a mount namespace copied into a less privileged
// user namespace: MNT_LOCK_READONLY, _NOSUID, _NODEV): a bind the holder
// makes of one keeps them, so root inside cannot make a read-only bind
// writable even with every capability of its user namespace (EPERM),
// the seccomp filter aside. After the fork the thread goes back to its
// first mount namespace, and the staging one ends with the last of its
// users (netnsstart.StartWith).
func stageBinds(binds []stagedBind) func() (func() error, error) {
	return func() (func() error, error) {
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/mnt", unix.Gettid()))
		if err != nil {
			return nil, fmt.Errorf("open mount namespace: %w", err)
		}
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			orig.Close()
			return nil, fmt.Errorf("unshare staging mount namespace: %w", err)
		}
		// Back to the first namespace after the fork: the staging one,
		// and the host's mounts it copied, are then the holder's copy's
		// alone (a copy held by a parked thread would keep busy every file
		// system mounted now, a sandbox's volume too).
		undo := func() error {
			defer orig.Close()
			if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("leave staging mount namespace: %w", err)
			}
			return nil
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return undo, fmt.Errorf("make staging mounts private: %w", err)
		}
		if err := os.MkdirAll(bindStage, 0o755); err != nil {
			return undo, fmt.Errorf("make bind staging directory: %w", err)
		}
		if err := unix.Mount("tmpfs", bindStage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
			return undo, fmt.Errorf("mount bind staging tmpfs: %w", err)
		}
		for i, b := range binds {
			p := bindStage + "/" + strconv.Itoa(i)
			var err error
			if b.dir {
				err = unix.Mkdir(p, 0o755)
			} else {
				var fd int
				if fd, err = unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); err == nil {
					unix.Close(fd)
				}
			}
			if err != nil {
				return undo, fmt.Errorf("make bind staging %s: %w", p, err)
			}
			if err := unix.MoveMount(int(b.f.Fd()), "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return undo, fmt.Errorf("stage bind %s: %w", b.f.Name(), err)
			}
		}
		return undo, nil
	}
}

// openBind clones b's source as a detached mount of that file or
// directory alone (open_tree(2) OPEN_TREE_CLONE: not what is mounted
// below it), as root and, unless follow, never through a symlink at its
// last element, and sets it nosuid, nodev and (unless b.Writable)
// read-only, recursively: the kernel holds the read-only flag from here,
// before the holder (or anything in the pod) ever has the mount. It
// returns whether it is a directory.
func openBind(b Bind, follow bool) (*os.File, bool, error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
	if !follow {
		flags |= unix.AT_SYMLINK_NOFOLLOW
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, b.Source, uint(flags))
	if err != nil {
		return nil, false, fmt.Errorf("open bind source %s: %w", b.Source, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, false, fmt.Errorf("stat bind source %s: %w", b.Source, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
		unix.Close(fd)
		return nil, false, fmt.Errorf("%w: bind source %s is not a directory or a regular file", ErrInvalid, b.Source)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if !b.Writable {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err != nil {
		unix.Close(fd)
		return nil, false, fmt.Errorf("set bind %s read-only: %w", b.Source, err)
	}
	return os.NewFile(uintptr(fd), b.Source), st.Mode&unix.S_IFMT == unix.S_IFDIR, nil
}

// idmapLowers clones each of the plan's system directories (or rootfs,
// when named: then it alone) as a detached,
// read-only, nosuid, nodev mount whose ids are seen through the holder
// pid's user namespace (mount_setattr(2) MOUNT_ATTR_IDMAP): the host's
// root's files there are the pod's root's, so root inside can change a
// file of /usr by the overlay's copy-up, which keeps the owner; without
// it root inside cannot write even /usr/local. It records the index of
// each descriptor in the plan.
func idmapLowers(pid int, rootfs string, plan *holderPlan) (fds []int, err error) {
	ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open pod user namespace: %w", err)
	}
	defer unix.Close(ns)
	clone := func(dir string) (int, error) {
		fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return -1, fmt.Errorf("clone %s: %w", dir, err)
		}
		fds = append(fds, fd)
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Userns_fd: uint64(ns)}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			return -1, fmt.Errorf("idmap %s: %w", dir, err)
		}
		return len(fds) - 1, nil
	}
	if rootfs != "" {
		plan.Rootfs, err = clone(rootfs)
		return fds, err
	}
	plan.Idmapped = make([]int, len(plan.SystemDirs))
	plan.Masked = make([]bool, len(plan.SystemDirs))
	for i, d := range plan.SystemDirs {
		plan.Idmapped[i] = -1
		plan.Masked[i] = masked(d)
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() {
			continue // a link, or missing: the holder sees it itself
		}
		if plan.Idmapped[i], err = clone(d); err != nil {
			return fds, err
		}
	}
	return fds, nil
}

// Adopt finds a holder again (after a runnerd restart): pid must be
// alive with the start time recorded at Create, else ErrGone. The
// pidfd is opened first and the start time read after, so the Pod names
// that process and no later one with the same pid.
func Adopt(pid int, startTime uint64) (*Pod, error) {
	p, err := own(pid, false)
	if err != nil {
		return nil, err
	}
	if p.start != startTime {
		unix.Close(p.pidfd)
		return nil, fmt.Errorf("%w: pid %d started at %d, not %d", ErrGone, pid, p.start, startTime)
	}
	return p, nil
}

// own opens pid's pidfd and reads its start time.
func own(pid int, child bool) (*Pod, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("%w: pid %d", ErrGone, pid)
	}
	if err != nil {
		return nil, fmt.Errorf("open pidfd %d: %w", pid, err)
	}
	unix.CloseOnExec(fd)
	st, err := StartTimeOf(pid)
	if err != nil {
		unix.Close(fd)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: pid %d", ErrGone, pid)
		}
		return nil, err
	}
	return &Pod{pid: pid, start: st, pidfd: fd, child: child, done: make(chan struct{}), mu: make(chan struct{}, 1)}, nil
}

// StartTimeOf reads pid's start time (clock ticks since boot, field 22
// of /proc/PID/stat), which with the pid names one process for its life.
func StartTimeOf(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold anything.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Release lets go of the holder without ending it (runnerd stopping with
// its sandboxes left running: a later Adopt finds it again). The Pod is
// unusable after; Destroy then returns nil without doing anything. A
// holder Create made stays this process's child: it is reaped when this
// process exits (its new parent then does).
func (p *Pod) Release() {
	p.mu <- struct{}{}
	defer func() { <-p.mu }()
	select {
	case <-p.done:
		return
	default:
	}
	unix.Close(p.pidfd)
	close(p.done)
}

// Destroy ends the pod: SIGKILL to the holder, whereupon the kernel kills
// every process of its pid namespace; it returns once the holder has
// exited (and, Create's, is reaped), which is after every other process
// of the namespace is gone and reaped (a command a shim started inside
// is the shim's to reap: Destroy waits for that too). Nothing was
// mounted outside the pod's mount namespace, so nothing is unmounted. A
// holder already gone is success; so is a second Destroy.
func (p *Pod) Destroy(ctx context.Context) error {
	select {
	case p.mu <- struct{}{}:
		defer func() { <-p.mu }()
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill pod holder %d: %w", p.pid, err)
	}
	if err := p.wait(ctx); err != nil {
		return err
	}
	unix.Close(p.pidfd)
	close(p.done)
	return nil
}

// wait waits for the holder's exit: its pidfd turns readable when it
// exits (an adopted holder is reaped by its parent); Create's is then
// reaped here.
func (p *Pod) wait(ctx context.Context) error {
	for {
		fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 100)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for pod holder %d: %w", p.pid, err)
		}
		if n > 0 {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("wait for pod holder %d: %w", p.pid, ctx.Err())
		}
	}
	if p.child {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, p.pidfd, &info, unix.WEXITED, nil)
		if err != nil && !errors.Is(err, unix.ECHILD) {
			return fmt.Errorf("reap pod holder %d: %w", p.pid, err)
		}
	}
	return nil
}

// expandDirs checks cfg and returns its system directories, globbed.
func expandDirs(cfg Config) ([]string, error) {
	if len(cfg.Holder) == 0 {
		return nil, fmt.Errorf("%w: no holder program", ErrInvalid)
	}
	if !validName(cfg.Name) {
		return nil, fmt.Errorf("%w: host name %q", ErrInvalid, cfg.Name)
	}
	if cfg.UIDBase == 0 || uint64(cfg.UIDBase)+BlockSize > 1<<32-1 {
		return nil, fmt.Errorf("%w: id block at %d", ErrInvalid, cfg.UIDBase)
	}
	for _, d := range []string{cfg.Upper, cfg.Workspace, cfg.Tmp, cfg.VarTmp} {
		if d == "" || !filepath.IsAbs(d) {
			return nil, fmt.Errorf("%w: Upper, Workspace, Tmp and VarTmp must be absolute paths", ErrInvalid)
		}
	}
	if cfg.ResolvConf != "" && !filepath.IsAbs(cfg.ResolvConf) {
		return nil, fmt.Errorf("%w: resolv.conf %q is not an absolute path", ErrInvalid, cfg.ResolvConf)
	}
	if cfg.Seccomp != nil {
		if _, err := seccomp.Decode(cfg.Seccomp); err != nil {
			return nil, fmt.Errorf("%w: seccomp program: %v", ErrInvalid, err)
		}
	}
	if err := checkBinds(cfg); err != nil {
		return nil, err
	}
	if cfg.Rootfs != "" {
		if !filepath.IsAbs(cfg.Rootfs) || strings.ContainsAny(cfg.Rootfs, ",:") {
			return nil, fmt.Errorf("%w: root file system %q", ErrInvalid, cfg.Rootfs)
		}
		return nil, nil
	}
	in := cfg.SystemDirs
	if in == nil {
		in = DefaultSystemDirs
	}
	var out []string
	for _, d := range in {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d || d == "/" || strings.ContainsAny(d, ",:\\") {
			return nil, fmt.Errorf("%w: system directory %q", ErrInvalid, d)
		}
		if !strings.HasSuffix(d, "*") {
			out = append(out, d)
			continue
		}
		m, err := filepath.Glob(d)
		if err != nil {
			return nil, fmt.Errorf("%w: system directory %q: %v", ErrInvalid, d, err)
		}
		out = append(out, m...)
	}
	return out, nil
}

// reservedTargets are the pod's own mounts, which no bind may cover or
// lie in: the kernel's views (/proc, /dev) and the sandbox's storage
// (/tmp, /var/tmp, the workspace), where a mount point would be made in
// a directory the sandbox writes.
var reservedTargets = []string{"/proc", "/dev", "/tmp", "/var/tmp", WorkspacePath}

// checkBinds checks cfg's binds (and its resolv.conf's): absolute
// sources; absolute, clean targets other than / and outside
// reservedTargets, no two the same or one inside another (its mount
// point would be made in the other's source, a host directory).
func checkBinds(cfg Config) error {
	targets := []string{}
	if cfg.ResolvConf != "" {
		targets = append(targets, "/etc/resolv.conf")
	}
	for _, b := range cfg.Binds {
		if !filepath.IsAbs(b.Source) {
			return fmt.Errorf("%w: bind source %q is not an absolute path", ErrInvalid, b.Source)
		}
		t := b.Target
		if !filepath.IsAbs(t) || filepath.Clean(t) != t || t == "/" || strings.ContainsRune(t, 0) {
			return fmt.Errorf("%w: bind target %q is not an absolute, clean path other than /", ErrInvalid, t)
		}
		for _, r := range reservedTargets {
			if within(t, r) {
				return fmt.Errorf("%w: bind target %q is in the pod's own %s", ErrInvalid, t, r)
			}
		}
		targets = append(targets, t)
	}
	for i, a := range targets {
		for _, b := range targets[i+1:] {
			if within(a, b) || within(b, a) {
				return fmt.Errorf("%w: bind targets %q and %q overlap", ErrInvalid, a, b)
			}
		}
	}
	return nil
}

// CheckBinds checks binds as Create will (ErrInvalid), before anything is
// made: for an operator's configuration, checked at start.
func CheckBinds(binds []Bind) error {
	return checkBinds(Config{Binds: binds, ResolvConf: "/etc/resolv.conf"})
}

// within reports whether path p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// openDir clones dir as a detached mount for the holder (open_tree(2),
// OPEN_TREE_CLONE: the directory alone, not what is mounted below it),
// never through a symlink at its last element. The clone is unmounted
// when its last descriptor closes, unless the holder attached it.
func openDir(dir string) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s is not a directory", ErrInvalid, dir)
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// socketPair returns a connected pair: ours, and the holder's as a file
// to pass.
func socketPair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("create socket pair: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "pod")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("create socket pair: %w", err)
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "pod"), nil
}
