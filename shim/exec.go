package shim

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/agentrunner/runner/internal/netnsstart"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// The exec path: everything that happens to a command between the shim's
// fork and the command's first instruction, in one order, written once
// (execSteps). runc's libcontainer (init_linux.go: finalizeNamespace) and
// bubblewrap are the model:
//
//  1. cgroup v2: the child is cloned straight into Spec.Cgroups' unified
//     directory (CLONE_INTO_CGROUP, SysProcAttr.CgroupFD), so not one
//     instruction of it runs, nor one page is charged, outside it;
//  2. network namespace: the child is forked from a locked thread that
//     setns(2)'d into Spec.NetNS (internal/netnsstart);
//  3. cgroups v1: the helper moves its locked thread (the one that
//     execs) into each v1 directory ("0" to tasks: joinCgroups says why
//     not cgroup.procs) as its first act, before it runs anything else of
//     the command's setup, let alone the command;
//  4. mount namespace: unshare, make every mount a slave, bind
//     Spec.ResolvConf read-only over /etc/resolv.conf (nsexec.go), then
//     Spec.Binds (a sandbox's private /tmp, /var/tmp, /dev/shm; unsharing
//     here when there was no resolv.conf), all as root, before the user
//     switch;
//  4b. UTS namespace (Spec.Hostname): unshare, sethostname, as root;
//  5. capability bounding set emptied but for CAP_NET_RAW (Spec.Isolate):
//     PR_CAPBSET_DROP needs CAP_SETPCAP, which the uid change below takes
//     away, so it comes first, as in runc. CAP_NET_RAW stays in the
//     bounding set only so that execve(2) of a binary with that file
//     capability (Debian's ping: cap_net_raw=ep) is not refused EPERM
//     (the kernel refuses an effective file capability the bounding set
//     cannot grant); no_new_privs (step 8) means the exec never grants
//     it, so the command's permitted and effective sets stay empty and
//     ping falls back to the ICMP echo socket ping_group_range allows;
//  6. credentials (Spec.User): setgroups, setgid, setuid, in that order
//     (each later call needs the privilege the earlier ones keep);
//  7. ambient and inheritable capabilities cleared (Spec.Isolate): setuid
//     to a non-root uid clears the permitted, effective and ambient sets,
//     but not the inheritable one;
//  8. no_new_privs (Spec.Isolate), last of the privilege steps: from here
//     execve(2) of a setuid binary or one with file capabilities gains
//     nothing;
//  9. chdir(Spec.Dir), as the user, as exec.Cmd does; with Spec.DirRoot
//     (runnerd: the workspace) Dir is resolved beneath it and never
//     leaves it, whatever symlinks the command planted (beneath.go): in
//     the helper DirRoot is opened (O_PATH) as root just before the user
//     switch, the rest of Dir resolved from it after the switch, as the
//     user, and entered with fchdir(2), so only the directories from the
//     root down must let the user in, not every directory above it (a
//     sandbox's uid reaches its own workspace under a state directory
//     whose parent, such as root's home or a test's temporary directory,
//     is 0700); on the direct path the shim resolves it beneath the root,
//     with the user's file-system identity (lookas.go), and the child
//     enters it by its descriptor (/proc/self/fd/N);
//  9b. every descriptor from 3 up marked close-on-exec (close_range(2)
//     with CLOSE_RANGE_CLOEXEC; MarkCloseOnExec): the command gets its
//     stdin, stdout and stderr and nothing else, whatever the shim (or
//     whoever started runnerd) left open without O_CLOEXEC. On the direct
//     path the shim marks its own table just before the fork (Go's child
//     dup2s only the stdio over 0-2, which clears the flag on those); the
//     helper marks its own before the execve;
//  10. seccomp filter (Spec.Isolate): Docker's default profile (package
//     seccomp), last before the execve because it needs no_new_privs and
//     denies the mount and unshare calls of the steps above; never
//     compiled here: the program comes compiled in the plan (Spec.Seccomp,
//     launch.Pool's one compile; filter.go) and the helper checks it
//     (length, version, architecture, checksum) and loads it as it came,
//     or refuses the start;
//  11. execve(2).
//
// Each step is done either at the fork (on the forking thread or by Go's
// child through SysProcAttr, whose own order is clone, setsid and
// terminal, setgroups/setgid/setuid, chdir, execve) or in the nsexec
// helper (nsexec.go), a re-executed shim that does its steps on one
// locked thread and then execs the command in its own process. A command
// takes the direct path, with no helper and nothing added to what an
// ordinary start costs, unless one of its steps can only run in the
// helper (mount namespace, cgroups v1, Isolate); then every step that the
// helper can do runs there, in this order, except the early ones (1, 2),
// which a helper forked for this start has done at its own fork.
//
// A helper started ahead (a warm shim starts one while it waits, so the
// helper's process start, 10-18 ms under load, is off the start's path)
// was forked before anyone knew the command: it does the early steps
// itself, first, on its locked thread: it writes its own pid into the v2
// directory's cgroup.procs (as step 3 does for v1; the pages its runtime
// touched before stay charged where they were, none of them the
// command's) and setns(2)'s that thread into Spec.NetNS, the namespace
// execve(2) keeps for the new program. What Go's child does at a fork
// (the command's stdin, stdout and stderr, its controlling terminal) the
// helper started ahead does before step 1, with the descriptors passed
// over its socket (nsexec.go).
//
// The shim process itself never joins a command's cgroup: the v2 one is
// entered by the clone, the v1 ones by the helper, so the shim survives
// the command's OOM and is not counted by its pids limit.
//
// Why the helper for cgroup v1 rather than moving the forking thread into
// each hierarchy's tasks file before the fork (and discarding the thread
// after): that puts a thread of the shim in the command's cgroups, where
// it counts against the pids limit (a fork bomb at pids.max would make the
// shim's own fork fail) and its memory charge is the shim's, and it costs
// an OS thread per start; the helper is never the shim, and a contained
// command (Isolate) pays for the helper anyway, so both share one
// re-exec. Measured with BenchmarkStartCommand (/bin/true, this 2-core
// VM, under load): the direct path as exec.Cmd.Start, about 2 ms; with a
// cgroup v2 directory (still direct, CLONE_INTO_CGROUP) the same; the
// helper (cgroups v1, Isolate) about 8-20 ms, most of it the re-executed
// binary's runtime start. Pure cgroup v2 hosts without Isolate stay on
// the direct path.

// execPlan is a command's exec path resolved from its Spec and exec.Cmd:
// what each step does, or nothing. The helper receives it as JSON.
type execPlan struct {
	// The early steps: at a helper's fork, or by a helper started ahead.
	NetNS    string `json:"netns,omitempty"`
	CgroupV2 string `json:"cgroup_v2,omitempty"`
	// Ahead: the helper was started ahead: it does the early steps and
	// takes the command's stdio (and, with Ctty, its terminal) from the
	// descriptors sent with the plan.
	Ahead bool `json:"ahead,omitempty"`
	Ctty  bool `json:"ctty,omitempty"`

	// Pod: the helper runs in a pod it joined before its runtime started
	// (pod.go): podSteps, not execSteps.
	Pod bool `json:"pod,omitempty"`

	CgroupsV1  []string          `json:"cgroups_v1,omitempty"`
	ResolvConf string            `json:"resolv_conf,omitempty"`
	Binds      []sessiondir.Bind `json:"binds,omitempty"`
	Hostname   string            `json:"hostname,omitempty"`
	Isolate    bool              `json:"isolate,omitempty"`
	// Seccomp is the compiled filter (seccomp.Filter.MarshalBinary) the
	// helper checks and installs without compiling (Isolate, and every
	// pod start): Spec.Seccomp, or the shim's one compile (filter.go).
	Seccomp []byte `json:"seccomp,omitempty"`
	// Trace: the helper measures its steps and reports them (trace.go).
	Trace   bool        `json:"trace,omitempty"`
	Cred    *nsexecCred `json:"cred,omitempty"` // nil keeps the shim's own
	Dir     string      `json:"dir,omitempty"`
	DirRoot string      `json:"cwd_root,omitempty"`
	Path    string      `json:"path"` // as looked up by the shim
	Argv    []string    `json:"argv"`
	Env     []string    `json:"env"`

	// dirFD is DirRoot opened (O_PATH) by the helper as root before the
	// user switch, for enterDir; 0: not opened.
	dirFD int
}

type nsexecCred struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
}

// forkSetup is what the fork-side steps configure: the forked process's
// SysProcAttr and directory, the namespace of the thread it is forked
// from, and what to close once it has started.
type forkSetup struct {
	cmd     *exec.Cmd
	netNS   string
	closers []*os.File
}

// execStep is one step of the exec path.
type execStep struct {
	name string
	// phase is the phase of a failure in the helper (PhaseExec for the
	// command's own directory, PhaseSetup for the rest).
	phase string
	// active reports whether the plan has this step at all.
	active func(p *execPlan) bool
	// fork does the step at the fork; nil when only the helper can.
	fork func(p *execPlan, f *forkSetup) error
	// helper does the step in the helper and returns what failed (for the
	// report) with the error; nil when the step happens only at the fork
	// (then it comes before every helper step in execSteps).
	helper func(p *execPlan) (string, error)
	// early marks a step a helper forked for the start does at its fork
	// (fork), and only a helper started ahead does itself (helper).
	early bool
}

// execSteps is the order (see the top of this file). TestExecStepOrder
// holds its invariant: fork-only steps come first.
var execSteps = []execStep{
	{name: "join cgroup v2", phase: proto.PhaseSetup, early: true,
		active: func(p *execPlan) bool { return p.CgroupV2 != "" },
		fork:   joinCgroupV2,
		helper: func(p *execPlan) (string, error) { return joinCgroupV2Ahead(p.CgroupV2) }},
	{name: "enter network namespace", phase: proto.PhaseSetup, early: true,
		active: func(p *execPlan) bool { return p.NetNS != "" },
		fork:   func(p *execPlan, f *forkSetup) error { f.netNS = p.NetNS; return nil },
		helper: enterNetNS},
	{name: "join cgroups v1", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return len(p.CgroupsV1) > 0 },
		helper: func(p *execPlan) (string, error) { return joinCgroups(p.CgroupsV1) }},
	{name: "mount resolv.conf", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return p.ResolvConf != "" },
		helper: mountResolvConf},
	{name: "bind directories", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return len(p.Binds) > 0 },
		helper: bindDirs},
	{name: "set hostname", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return p.Hostname != "" },
		helper: setHostname},
	{name: "empty the capability bounding set", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return p.Isolate },
		helper: dropBoundingSet},
	{name: "open the working directory", phase: proto.PhaseExec,
		active: func(p *execPlan) bool { return p.Dir != "" && p.DirRoot != "" },
		// At the fork exec.Cmd chdirs after the user switch, as before.
		fork:   func(*execPlan, *forkSetup) error { return nil },
		helper: openDir},
	{name: "switch user", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return p.Cred != nil },
		fork: func(p *execPlan, f *forkSetup) error {
			f.cmd.SysProcAttr.Credential = &syscall.Credential{Uid: p.Cred.UID, Gid: p.Cred.GID, Groups: p.Cred.Groups}
			return nil
		},
		helper: switchUser},
	{name: "clear ambient and inheritable capabilities", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return p.Isolate },
		helper: clearCaps},
	{name: "set no_new_privs", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return p.Isolate },
		helper: func(*execPlan) (string, error) {
			return "nsexec: set no_new_privs", unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
		}},
	{name: "chdir", phase: proto.PhaseExec,
		active: func(p *execPlan) bool { return p.Dir != "" },
		fork:   forkDir,
		helper: enterDir},
	{name: "mark inherited descriptors close-on-exec", phase: proto.PhaseSetup,
		active: func(*execPlan) bool { return true },
		fork:   func(*execPlan, *forkSetup) error { return MarkCloseOnExec() },
		helper: func(*execPlan) (string, error) { return "nsexec: mark descriptors close-on-exec", MarkCloseOnExec() }},
	{name: "load the seccomp filter", phase: proto.PhaseSetup,
		active: func(p *execPlan) bool { return p.Isolate },
		helper: loadSeccomp},
}

// newExecPlan resolves cmd (as server.start built it, Credential and Dir
// included) and spec into a plan.
func newExecPlan(cmd *exec.Cmd, spec sessiondir.Spec) (*execPlan, error) {
	p := &execPlan{NetNS: spec.NetNS, ResolvConf: spec.ResolvConf, Binds: spec.Binds, Hostname: spec.Hostname, Isolate: spec.Isolate,
		Dir: cmd.Dir, DirRoot: spec.DirRoot} // Path, Argv and Env only for the helper (startNsexec)
	if c := cmd.SysProcAttr.Credential; c != nil {
		p.Cred = &nsexecCred{UID: c.Uid, GID: c.Gid, Groups: c.Groups}
	}
	if p.Isolate && (p.Cred == nil || p.Cred.UID == 0) {
		// validate refused this; the user database may have changed since.
		return nil, fmt.Errorf("%w: isolate: user %q runs as root", sessiondir.ErrInvalid, spec.User)
	}
	if p.Isolate || spec.Pod != nil {
		prog, err := filterFor(spec.Seccomp)
		if err != nil {
			return nil, fmt.Errorf("build the seccomp filter: %w", err)
		}
		p.Seccomp = prog
	}
	for _, dir := range spec.Cgroups {
		v2, err := sessiondir.CgroupKind(dir)
		if err != nil {
			return nil, err
		}
		if err := sessiondir.NotOurs(dir); err != nil {
			return nil, err
		}
		if v2 {
			p.CgroupV2 = dir
		} else {
			p.CgroupsV1 = append(p.CgroupsV1, dir)
		}
	}
	return p, nil
}

// needsHelper reports whether one of the plan's steps can only run in the
// helper.
func (p *execPlan) needsHelper() bool {
	for _, st := range execSteps {
		if st.fork == nil && st.active(p) {
			return true
		}
	}
	return false
}

// execCommand is the one function that decides how a command starts and
// reaches its execve: directly (Go's fork and exec, from the thread in
// Spec.NetNS) when every step of its plan can be done at the fork, which
// is the path every ordinary session takes, else through the nsexec
// helper, whose one execve (nsexecMain) runs the command in the helper's
// own process: the helper started ahead (ahead, nil: none) when there is
// one, else one forked for this start; both report through awaitReport.
// Either way it returns once the command's execve succeeded, with
// cmd.Process being the command.
//
// before (nil: none) is called once just before the command can run:
// before the fork on the direct path or with a helper forked for the
// start, and after the plan was handed to a helper started ahead, which
// does every step up to the execve while before runs (a warm shim's
// before waits for runnerd's commit) and execs only once it returned nil.
// An error from before is returned and nothing runs. A helper started
// ahead that died while it waited (its report is empty: the command never
// ran) is replaced by one forked for this start. ahead is the caller's to
// discard unless ahead.used says it became the command.
func execCommand(cmd *exec.Cmd, spec sessiondir.Spec, ahead *nsexecAhead, before func() error) error {
	if before == nil {
		before = func() error { return nil }
	}
	t := spanStart()
	p, err := newExecPlan(cmd, spec)
	if err != nil {
		return err
	}
	p.Trace = tracing()
	span("plan", t)
	if spec.Pod != nil {
		// A helper started ahead runs its runtime already: it cannot
		// join a user namespace. The caller discards it.
		if err := before(); err != nil {
			return err
		}
		return startInPod(cmd, spec, p)
	}
	if p.needsHelper() {
		sent := ahead != nil && ahead.send(cmd, p)
		if err := before(); err != nil {
			return err
		}
		if sent {
			if err, taken := ahead.exec(cmd); taken {
				return err
			}
		}
		p.Ahead, p.Ctty = false, false
		return startNsexec(cmd, p)
	}
	if err := before(); err != nil {
		return err
	}
	// The fork-side steps redo what they are given; start from a clean
	// SysProcAttr and directory so nothing is set twice.
	cmd.SysProcAttr.Credential, cmd.Dir = nil, ""
	t = spanStart()
	f, err := forkSteps(cmd, p, false)
	if err != nil {
		return err
	}
	defer f.close()
	err = proto.AsCommandError(netnsstart.Start(cmd, f.netNS))
	span("fork and exec (direct)", t)
	return err
}

// forkSteps applies the plan's fork-side steps to cmd: every active one
// for the direct path, only the fork-only ones for the helper's fork.
func forkSteps(cmd *exec.Cmd, p *execPlan, helper bool) (*forkSetup, error) {
	f := &forkSetup{cmd: cmd}
	for _, st := range execSteps {
		if !st.active(p) || (helper && st.helper != nil && !st.early) {
			continue
		}
		if err := st.fork(p, f); err != nil {
			f.close()
			return nil, err
		}
	}
	return f, nil
}

func (f *forkSetup) close() {
	for _, c := range f.closers {
		c.Close()
	}
}

// MarkCloseOnExec marks every descriptor of the calling process from 3 up
// close-on-exec, so that no program it executes inherits one it did not
// pass on purpose (os/exec dup2s what it passes, which clears the flag on
// the copy). The process itself keeps using them. close_range(2) with
// CLOSE_RANGE_CLOEXEC (Linux 5.11); before that, each descriptor listed
// in /proc/self/fd.
func MarkCloseOnExec() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return err
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list descriptors: %w", err)
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		// The directory's own descriptor is closed by now: EBADF.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("mark descriptor %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}
