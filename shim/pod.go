package shim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/podjoin"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// A session in a pod (Spec.Pod). The shim stays outside (the host's pid
// and user namespaces: invisible and unsignalable from inside) and
// starts the nsexec helper with the holder's pidfd and the session's ids
// in podjoin.EnvVar. The helper's C constructor (package podjoin), before
// the Go runtime starts, joins the holder's namespaces with one setns,
// takes the session's ids inside and forks with CLONE_PARENT: the
// command's process is the shim's child, so its exit code and signal come
// from the shim's own wait4 as for any command, and the constructor's
// process reports that pid and exits (the shim reaps it here). The child
// runs the Go helper with podSteps: a session of its own (and the
// terminal), its descriptors close-on-exec, the working directory inside
// the pod, no_new_privs, the seccomp filter, and the execve of the path
// looked up in the pod. Nothing is mounted, unshared or named per spawn:
// the pod has it all. Processes the command leaves behind reparent to
// the pod's init, the holder, which reaps them.
//
// The report on the helper's socket is the usual one, after a first line
// "pod PID\n" from the constructor's process.

// podSteps are the helper's steps in a pod, in order (the pod path of
// execSteps: no mount, uts, user switch or bounding set step; the ids
// were taken before the runtime started).
var podSteps = []execStep{
	{name: "make a session", phase: proto.PhaseSetup,
		active: func(*execPlan) bool { return true },
		helper: podSession},
	{name: "mark inherited descriptors close-on-exec", phase: proto.PhaseSetup,
		active: func(*execPlan) bool { return true },
		helper: func(*execPlan) (string, error) { return "nsexec: mark descriptors close-on-exec", MarkCloseOnExec() }},
	{name: "chdir", phase: proto.PhaseExec,
		active: func(p *execPlan) bool { return p.Dir != "" },
		helper: func(p *execPlan) (string, error) { return "chdir " + p.Dir, unix.Chdir(p.Dir) }},
	{name: "look up the command", phase: proto.PhaseExec,
		active: func(*execPlan) bool { return true },
		helper: lookPathInPod},
	{name: "set no_new_privs", phase: proto.PhaseSetup,
		active: func(*execPlan) bool { return true },
		helper: func(*execPlan) (string, error) {
			return "nsexec: set no_new_privs", unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
		}},
	{name: "load the seccomp filter", phase: proto.PhaseSetup,
		active: func(*execPlan) bool { return true },
		helper: loadSeccomp},
}

// podSession makes the command lead a session of its own, as Go's child
// does with Setsid (the constructor's process, which the shim forked,
// did not take it: its exit would hang up a terminal it held), and with
// Ctty makes fd 0 its controlling terminal.
func podSession(p *execPlan) (string, error) {
	if _, err := unix.Setsid(); err != nil {
		return "nsexec: setsid", err
	}
	if p.Ctty {
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 1); err != nil {
			return "nsexec: set controlling terminal", err
		}
	}
	return "", nil
}

// lookPathInPod resolves p.Path (Argv[0], as the shim left it) in the
// pod, with the PATH of the command's environment, as the user: the
// shim cannot, its view of the files is the host's.
func lookPathInPod(p *execPlan) (string, error) {
	if strings.Contains(p.Path, "/") {
		return "", nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range p.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		f := filepath.Join(dir, p.Path)
		var st unix.Stat_t
		if unix.Stat(f, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && unix.Access(f, unix.X_OK) == nil {
			p.Path = f
			return "", nil
		}
	}
	return "exec: " + strconv.Quote(p.Path) + ": executable file not found in $PATH", unix.ENOENT
}

// startInPod starts cmd (as server.start built it, its Path still
// Argv[0]) in the pod spec.Pod names, through the helper.
func startInPod(cmd *exec.Cmd, spec sessiondir.Spec, p *execPlan) error {
	if !podjoin.Supported {
		return fmt.Errorf("start in pod: this shim was built without cgo, which joining a pod needs (package podjoin): %w", unix.ENOTSUP)
	}
	uid, gid, err := sessiondir.PodUser(spec.User)
	if err != nil {
		return err
	}
	// The holder's pidfd, then its start time: the pidfd names the
	// process that had it, and no later one with its pid.
	pidfd, err := unix.PidfdOpen(spec.Pod.PID, 0)
	if err != nil {
		return fmt.Errorf("open pod holder %d: %w", spec.Pod.PID, err)
	}
	pfd := os.NewFile(uintptr(pidfd), "pod")
	defer pfd.Close()
	if st, err := pod.StartTimeOf(spec.Pod.PID); err != nil || st != spec.Pod.StartTime {
		return fmt.Errorf("open pod holder %d: not the holder that started at %d (%v): %w", spec.Pod.PID, spec.Pod.StartTime, err, unix.ESRCH)
	}
	extra := []*os.File{nil, pfd} // fd 3: the socket (below); fd 4: the pidfd
	for _, dir := range p.CgroupsV1 {
		f, err := os.OpenFile(filepath.Join(dir, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("open cgroup %s: %w", dir, proto.UnwrapPath(err))
		}
		defer f.Close()
		extra = append(extra, f)
	}
	join := fmt.Sprintf("%s=%d,%d,%d,%d", podjoin.EnvVar, 4, uid, gid, nsexecFD)
	for i := range p.CgroupsV1 {
		join += "," + strconv.Itoa(5+i)
	}

	p.Pod, p.CgroupsV1 = true, nil
	p.Ctty = cmd.SysProcAttr != nil && cmd.SysProcAttr.Setctty
	p.Path, p.Argv, p.Env = cmd.Path, cmd.Args, cmd.Environ()
	uc, child, err := proto.SocketPair("nsexec-pod")
	if err != nil {
		return fmt.Errorf("nsexec: create socket pair: %w", err)
	}
	defer child.Close()
	defer uc.Close()
	extra[0] = child
	// The constructor's process leads no session and takes no terminal:
	// the child it forks does both (podSession).
	attr := &syscall.SysProcAttr{}
	cmd.Path = "/proc/self/exe"
	cmd.Args = append(append([]string{os.Args[0]}, mainPrefix...), nsexecArg)
	cmd.Env = append(os.Environ(), join)
	cmd.Dir = ""
	cmd.SysProcAttr = attr
	cmd.ExtraFiles = extra
	t := spanStart()
	f, err := forkSteps(cmd, p, true) // cgroup v2: cloned into it, and the command with it
	if err != nil {
		return err
	}
	err = cmd.Start()
	f.close()
	span("pod helper fork", t)
	if err != nil {
		return err
	}
	t = spanStart()
	child.Close()
	uc.SetDeadline(time.Now().Add(nsexecTimeout))
	b, _ := json.Marshal(p)
	_, werr := uc.Write(b)
	uc.CloseWrite()
	r := bufio.NewReader(io.LimitReader(uc, 4096))
	first, rerr := r.ReadString('\n')
	span("pod join (constructor: setns, ids, fork)", t)
	t = spanStart()
	defer span("pod helper plan to exec ack", t)
	pidStr, ok := strings.CutPrefix(first, "pod ")
	cpid, perr := strconv.Atoi(strings.TrimSuffix(pidStr, "\n"))
	if !ok || perr != nil || cpid <= 0 {
		// It failed, or said nothing in time: it must not linger.
		cmd.Process.Kill()
	}
	// The constructor's process has ended (or is ending): reap it.
	cmd.Process.Wait()
	if !ok || perr != nil || cpid <= 0 {
		if rerr != nil && first == "" {
			return fmt.Errorf("nsexec: the helper ended before joining the pod: %w", rerr)
		}
		return parseNsexecReport(first) // its error line
	}
	rest, rerr := io.ReadAll(r)
	if rerr == nil {
		rerr = werr
	}
	repErr := parseNsexecReport(string(rest))
	if repErr == nil && rerr != nil && !errors.Is(rerr, syscall.ECONNRESET) {
		repErr = fmt.Errorf("nsexec: read the helper's report: %w", rerr)
	}
	if repErr != nil {
		// The command's process is ours to reap: it never ran the command.
		var ws syscall.WaitStatus
		syscall.Kill(cpid, syscall.SIGKILL)
		syscall.Wait4(cpid, &ws, 0, nil)
		return repErr
	}
	proc, err := os.FindProcess(cpid)
	if err != nil {
		return err
	}
	cmd.Process = proc
	return nil
}
