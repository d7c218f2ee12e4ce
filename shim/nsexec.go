package shim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/agentrunner/runner/internal/netnsstart"
	"github.com/agentrunner/runner/shim/internal/proto"
	"golang.org/x/sys/unix"
)

// The nsexec helper runs the exec path's steps (exec.go) that Go's fork
// cannot: a mount namespace for Spec.ResolvConf and Spec.Binds, joining cgroup v1
// directories, and Spec.Isolate's capability and no_new_privs steps. Go
// runs no code of ours in a child between fork and execve, so the shim
// starts itself as a small helper that does those steps on its locked
// thread and then execve(2)s the command in its own process: the pid the
// shim reports, waits for and signals is the command's.
//
// Dispatch: the helper is the shim's own executable (/proc/self/exe) run
// with the argument prefix that led to Main (e.g. "serve" for
// runner-shim, "shim" for runnerd) followed by the single argument
// nsexecArg; Main recognises it before parsing flags. Start always passes
// an absolute session directory, so nsexecArg never collides with one.
// The helper runs with the shim's environment (the command gets Spec.Env
// at execve, nothing else).
//
// The helper is forked like the command would be (same SysProcAttr:
// setsid, controlling terminal; from the thread inside Spec.NetNS, so it
// is in the network namespace; cloned into the cgroup v2 directory), but
// without Credential, Dir or the command's environment. As root it then
// runs, in execSteps' order, each of the plan's steps that has a helper
// side; the mount namespace step
//
//  1. unshare(CLONE_NEWNS) on its locked thread;
//  2. makes every mount a slave (MS_REC|MS_SLAVE on "/"), so nothing it
//     mounts propagates back to the host's mount table (the host's later
//     mounts still propagate in);
//  3. bind-mounts Spec.ResolvConf over /etc/resolv.conf, or over the
//     file it resolves to when /etc/resolv.conf is a symlink (e.g. to
//     systemd-resolved's stub file: a program follows the link into the
//     bind mount); a dangling or missing /etc/resolv.conf fails the
//     start;
//  4. remounts that bind read-only (keeping the mount's nosuid, nodev,
//     noexec and atime flags, which the kernel may insist on);
//  5. then (bindDirs; steps 1-2 there when there is no ResolvConf) opens
//     every Spec.Binds source, and bind-mounts each over its target,
//     remounted nosuid and nodev;
//
// and the user switch (setgroups, setgid, setuid, all threads) comes
// after the mounts because an unprivileged user cannot mount. Last come
// chdir(Spec.Dir), as the user, the seccomp filter (Isolate), and
// execve(2) of the path the shim looked
// up (PATH lookup is the shim's, unchanged), with the command's argv and
// environment.
//
// Protocol, on a socket pair whose helper end is the helper's fd 3 (made
// close-on-exec by the helper at once, so the command never sees it): the
// shim writes one JSON execPlan and shuts its write side; the helper
// writes "exec\n" just before execve(2), and on any failure
// "error ERRNO PHASE STEP\n" (PHASE as in the readiness line: exec for
// the chdir and the execve, setup for the rest) and exits 127. The shim reads to EOF: "exec" alone
// means the execve succeeded (the socket closed with it); an error line is
// the start error, its errno preserved (so ENOENT still unwraps to
// fs.ErrNotExist through StartError); EOF without "exec" means the helper
// died before it got there, which fails the start too. The helper
// recovers its own panics into an error line. A helper that reports
// nothing within nsexecTimeout is killed and the start fails.
//
// The mount namespace lives as long as the command or any process that
// inherited it. It is not a security boundary: a command running as root
// can unmount the file and see the host's /etc/resolv.conf (which names
// servers a contained sandbox cannot reach anyway). The bind pins the
// file's inode at start: a later replacement of Spec.ResolvConf by rename
// is not seen by a running command.
// A helper started ahead (nsexecAhead, started by a warm shim while it
// waits; argument nsexecAheadArg) is forked with Setsid and nothing else
// of the command: it says "ahead\n" on fd 3 once its runtime is up, then
// blocks on fd 3 for the plan (its length, 4 bytes big endian, then the
// JSON, Ahead set) with the command's stdin, stdout and stderr as
// SCM_RIGHTS on its first bytes. It makes them its 0, 1 and 2 (and, with
// Ctty, fd 0 its controlling terminal: it leads its own session), runs
// every step, the early ones included, and then waits for one more byte,
// nsexecGo, before it says "exec" and execs: the shim sends the plan
// before a warm start's gate (runnerd's commit) and the go after it, so
// the steps overlap the commit and the command still runs only after it.
// EOF instead of the go, or before a plan (the shim discarded it, or
// died), makes it exit without running anything. The report is the
// same. A helper that dies while it waits leaves an empty report; the
// command never ran, and execCommand forks a helper for the start
// instead.
const (
	nsexecArg      = "__runner_nsexec"
	nsexecAheadArg = "__runner_nsexec_ahead"
	// nsexecGo is the byte that tells a helper started ahead, its steps
	// done, to execute the command.
	nsexecGo = 'g'
	// nsexecUpTimeout bounds how long a warm shim waits for its helper's
	// "ahead" line before it goes without one.
	nsexecUpTimeout = 10 * time.Second
	nsexecFD        = 3
	nsexecTimeout   = 30 * time.Second
	nsexecExit      = 127
	resolvConf      = "/etc/resolv.conf"
)

// mainPrefix is the part of os.Args between the program name and the
// arguments Main was given ("serve", "shim", or nothing), recorded by Main
// so the helper is reached the same way the shim was.
var mainPrefix []string

func setMainPrefix(args []string) {
	if n := len(os.Args) - len(args); n >= 1 && n <= len(os.Args) {
		mainPrefix = append([]string(nil), os.Args[1:n]...)
	}
}

// isNsexec reports whether Main's arguments ask for the helper mode, and
// whether it is the helper started ahead.
func isNsexec(args []string) (helper, ahead bool) {
	if len(args) != 1 {
		return false, false
	}
	return args[0] == nsexecArg || args[0] == nsexecAheadArg, args[0] == nsexecAheadArg
}

// nsexecAhead is a helper started before its command is known. The warm
// shim that started it owns it: start uses it, at most once; discard
// kills and reaps it unless it became the command.
type nsexecAhead struct {
	cmd     *exec.Cmd
	conn    *net.UnixConn
	used    bool  // it became the command (cmd.Process is the command's)
	sendErr error // send's write error, for exec
}

// startNsexecAhead starts a helper ahead. It does not wait for it to be
// up (awaitUp does), so its start overlaps the caller's own work.
func startNsexecAhead() (*nsexecAhead, error) {
	uc, child, err := proto.SocketPair("nsexec-ahead")
	if err != nil {
		return nil, fmt.Errorf("nsexec: create socket pair: %w", err)
	}
	defer child.Close()
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: append(append([]string{os.Args[0]}, mainPrefix...), nsexecAheadArg),
		Env: os.Environ(), SysProcAttr: &syscall.SysProcAttr{Setsid: true}, ExtraFiles: []*os.File{child}}
	if err := cmd.Start(); err != nil {
		uc.Close()
		return nil, fmt.Errorf("nsexec: start helper ahead: %w", err)
	}
	return &nsexecAhead{cmd: cmd, conn: uc}, nil
}

// awaitUp waits for the helper's "ahead" line.
func (h *nsexecAhead) awaitUp(timeout time.Duration) error {
	h.conn.SetReadDeadline(time.Now().Add(timeout))
	defer h.conn.SetReadDeadline(time.Time{})
	var b [6]byte
	if _, err := io.ReadFull(h.conn, b[:]); err != nil || string(b[:]) != "ahead\n" {
		return fmt.Errorf("nsexec: helper ahead: got %q (%v)", b, err)
	}
	return nil
}

// discard kills and reaps the helper unless it became the command.
// Idempotent.
func (h *nsexecAhead) discard() {
	if h == nil || h.used || h.conn == nil {
		return
	}
	h.conn.Close()
	h.conn = nil
	h.cmd.Process.Kill()
	h.cmd.Wait()
}

// kill is discard for a shim whose reaper will run (it reaps every child):
// the helper is killed, not waited for, so the start's path does not wait
// out its exit.
func (h *nsexecAhead) kill() {
	if h == nil || h.used || h.conn == nil {
		return
	}
	h.conn.Close()
	h.conn = nil
	h.cmd.Process.Kill()
	h.cmd.Process.Release()
}

// send hands the helper the plan p of the command cmd (as server.start
// built it), with cmd's stdin, stdout and stderr. It reports false when
// that was not possible (the helper is gone, or a stdio is not a file);
// the helper is then discarded and cmd unchanged. The helper does its
// steps at once and waits for exec to say go.
func (h *nsexecAhead) send(cmd *exec.Cmd, p *execPlan) bool {
	if h.conn == nil {
		return false
	}
	var fds []int
	for _, s := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		f, ok := s.(*os.File)
		if !ok {
			h.discard() // only descriptors can be sent; never so in the shim
			return false
		}
		fds = append(fds, int(f.Fd()))
	}
	p.Ahead, p.Ctty = true, cmd.SysProcAttr != nil && cmd.SysProcAttr.Setctty
	p.Path, p.Argv, p.Env = cmd.Path, cmd.Args, cmd.Environ()
	t := spanStart()
	defer span("helper ahead send plan", t)
	js, _ := json.Marshal(p)
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(js)), uint32(len(js)))
	b = append(b, js...)
	h.conn.SetDeadline(time.Now().Add(nsexecTimeout))
	n, _, err := h.conn.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	if err == nil && n < len(b) {
		_, err = h.conn.Write(b[n:])
	}
	// A failed write (the helper died) is not final here: exec reads what
	// it said, if anything.
	h.sendErr = err
	return true
}

// exec tells the helper, which was sent its plan, to execute the command,
// and reads its report. taken is false when the helper had died before it
// did anything of the start (its report is empty): then it is reaped,
// nothing of the command ran, cmd is unchanged and the caller starts the
// command another way. Otherwise err is the start's result, as
// startNsexec's, and on success cmd.Process is the command.
func (h *nsexecAhead) exec(cmd *exec.Cmd) (err error, taken bool) {
	if h.conn == nil {
		return nil, false
	}
	fail := func(err error) (error, bool) {
		h.discard()
		return err, true
	}
	t := spanStart()
	defer span("helper ahead go to exec ack", t)
	h.conn.SetDeadline(time.Now().Add(nsexecTimeout))
	werr := h.sendErr
	if werr == nil {
		_, werr = h.conn.Write([]byte{nsexecGo})
	}
	silent, err := awaitReport(h.conn, werr)
	if silent {
		h.discard() // it never started anything: the caller starts the command another way
		return nil, false
	}
	if err != nil {
		return fail(err)
	}
	h.used = true
	h.conn.Close()
	cmd.Process = h.cmd.Process
	return nil, true
}

// startNsexec starts the command through the helper, which does the
// plan's helper steps (exec.go) and execs it.
func startNsexec(cmd *exec.Cmd, p *execPlan) error {
	var attr syscall.SysProcAttr
	if cmd.SysProcAttr != nil {
		attr = *cmd.SysProcAttr
	}
	attr.Credential = nil // the helper stays root until its own "switch user"
	p.Path, p.Argv, p.Env = cmd.Path, cmd.Args, cmd.Environ()
	uc, child, err := proto.SocketPair("nsexec")
	if err != nil {
		return fmt.Errorf("nsexec: create socket pair: %w", err)
	}
	defer child.Close()
	defer uc.Close()

	cmd.Path = "/proc/self/exe" // this program, even if its file was replaced since
	cmd.Args = append(append([]string{os.Args[0]}, mainPrefix...), nsexecArg)
	cmd.Env = os.Environ()
	cmd.Dir = ""
	cmd.SysProcAttr = &attr
	cmd.ExtraFiles = []*os.File{child} // fd 3 = nsexecFD
	t := spanStart()
	f, err := forkSteps(cmd, p, true)
	if err != nil {
		return err
	}
	err = netnsstart.Start(cmd, f.netNS)
	f.close()
	span("helper fork", t)
	if err != nil {
		return err
	}
	child.Close()
	t = spanStart()
	defer span("helper plan to exec ack", t)
	fail := func(err error) error {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	uc.SetDeadline(time.Now().Add(nsexecTimeout))
	b, _ := json.Marshal(p)
	// A failed write (the helper died before reading) is not final: what
	// it said, if anything, is the answer.
	_, werr := uc.Write(b)
	if _, err := awaitReport(uc, werr); err != nil {
		return fail(err)
	}
	return nil
}

// nsexecMain is the helper (see the top of this file), started ahead or
// not. It returns only on failure (or, started ahead, when discarded),
// with the exit status; on success execve replaced it.
func nsexecMain(ahead bool) (code int) {
	// Never unlocked: the mount namespace belongs to this thread, and the
	// execve must happen on it.
	runtime.LockOSThread()
	up := time.Now() // the runtime is up
	unix.CloseOnExec(nsexecFD)
	f := os.NewFile(nsexecFD, "nsexec")
	phase := proto.PhaseSetup
	var spans helperSpans // with p.Trace: sent before the report line
	fail := func(step string, err error) int {
		spans.write(f)
		var en syscall.Errno
		if errors.As(err, &en) {
			fmt.Fprintf(f, "error %d %s %s\n", int(en), phase, oneLine(step))
		} else {
			fmt.Fprintf(f, "error 0 %s %s\n", phase, oneLine(fmt.Sprintf("%s: %v", step, err)))
		}
		return nsexecExit
	}
	defer func() {
		if r := recover(); r != nil {
			code = fail("nsexec helper", fmt.Errorf("panic: %v", r))
		}
	}()
	var p execPlan
	// goByte waits for the go of a helper started ahead; false: the start
	// was called off (EOF), nothing is executed.
	goByte := func() bool { return true }
	if ahead {
		if _, err := f.WriteString("ahead\n"); err != nil {
			return nsexecExit
		}
		stdio, rest, err := recvPlan(nsexecFD, &p)
		if errors.Is(err, io.EOF) {
			return 0 // discarded before any start
		}
		if err == nil && !p.Ahead {
			err = errors.New("plan not for a helper started ahead")
		}
		if err != nil {
			return fail("nsexec: read parameters", err)
		}
		if what, err := takeStdio(stdio, p.Ctty); err != nil {
			return fail(what, err)
		}
		goByte = func() bool {
			if len(rest) == 0 {
				rest = make([]byte, 1)
				if n, _ := f.Read(rest); n != 1 {
					return false
				}
			}
			return rest[0] == nsexecGo
		}
	} else if err := json.NewDecoder(f).Decode(&p); err != nil {
		return fail("nsexec: read parameters", err)
	}
	if p.Trace {
		spans.add("read plan", up)
	}
	steps := execSteps
	if p.Pod {
		steps = podSteps
	}
	for _, st := range steps {
		if st.helper == nil || !st.active(&p) || (st.early && !p.Ahead) {
			continue
		}
		phase = st.phase
		t := time.Now()
		what, err := st.helper(&p)
		if p.Trace {
			spans.add(st.name, t)
		}
		if err != nil {
			return fail(what, err)
		}
	}
	if !goByte() {
		return nsexecExit
	}
	phase = proto.PhaseExec // from here on a failure is the command's own
	spans.write(f)
	if _, err := f.WriteString("exec\n"); err != nil {
		return nsexecExit // the shim is gone or gave up: do not run the command
	}
	err := syscall.Exec(p.Path, p.Argv, p.Env)
	return fail("exec "+p.Path, err)
}

// mountResolvConf is the helper's mount namespace step (steps 1-4 of the
// helper's description at the top of this file).
func mountResolvConf(p *execPlan) (string, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return "nsexec: unshare mount namespace", err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return "nsexec: make mounts slave", err
	}
	target, err := filepath.EvalSymlinks(resolvConf)
	if err != nil {
		return "nsexec: resolve " + resolvConf, err
	}
	if err := unix.Mount(p.ResolvConf, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Sprintf("nsexec: bind-mount %s over %s", p.ResolvConf, target), err
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(target, &sfs); err != nil {
		return "nsexec: statfs " + target, err
	}
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|keptFlags(int64(sfs.Flags)), ""); err != nil {
		return "nsexec: remount " + target + " read-only", err
	}
	return "", nil
}

// bindDirs is the helper's bind step: in the command's mount namespace
// (made here when mountResolvConf did not run), each of p.Binds, nosuid
// and nodev (read-only too where it says so).
func bindDirs(p *execPlan) (string, error) {
	if p.ResolvConf == "" {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return "nsexec: unshare mount namespace", err
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			return "nsexec: make mounts slave", err
		}
	}
	// Every source is opened before the first mount: a source under /tmp
	// (the host's) would be looked up in the private one once that is
	// mounted.
	srcs := make([]int, len(p.Binds))
	for i, b := range p.Binds {
		// A directory or a file: the kernel refuses a bind of one over the
		// other (ENOTDIR, EISDIR). Never a symlink (ELOOP): root would
		// mount wherever it points (runnerd's sources are its own files
		// in a directory only root can change; a link there is not).
		fd, err := unix.Open(b.Source, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "nsexec: open " + b.Source, err
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return "nsexec: stat " + b.Source, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return "nsexec: bind source " + b.Source + " is a symlink", unix.ELOOP
		}
		srcs[i] = fd
	}
	for i, b := range p.Binds {
		if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", srcs[i]), b.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Sprintf("nsexec: bind-mount %s over %s", b.Source, b.Target), err
		}
		var sfs unix.Statfs_t
		if err := unix.Statfs(b.Target, &sfs); err != nil {
			return "nsexec: statfs " + b.Target, err
		}
		flags, what := uintptr(unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV), " nosuid,nodev"
		if b.ReadOnly {
			flags, what = flags|unix.MS_RDONLY, " read-only,nosuid,nodev"
		}
		if err := unix.Mount("", b.Target, "", flags|keptFlags(int64(sfs.Flags)), ""); err != nil {
			return "nsexec: remount " + b.Target + what, err
		}
	}
	return "", nil
}

// setHostname is the helper's UTS step: a UTS namespace of the command's
// own, named p.Hostname; the host's name is neither seen nor settable.
func setHostname(p *execPlan) (string, error) {
	if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
		return "nsexec: unshare uts namespace", err
	}
	if err := unix.Sethostname([]byte(p.Hostname)); err != nil {
		return "nsexec: set hostname", err
	}
	return "", nil
}

// keptFlags are the per-mount flags a read-only remount must repeat (the
// kernel refuses to clear locked ones, and would clear the others).
func keptFlags(st int64) uintptr {
	var fl uintptr
	for _, m := range []struct {
		st int64
		ms uintptr
	}{
		{unix.ST_NOSUID, unix.MS_NOSUID}, {unix.ST_NODEV, unix.MS_NODEV}, {unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME}, {unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if st&m.st != 0 {
			fl |= m.ms
		}
	}
	return fl
}

// recvPlan reads the plan from the socket fd (its length, 4 bytes big
// endian, then its JSON) and the descriptors that came with it
// (close-on-exec); rest is what came after the plan. io.EOF: nothing came
// at all.
func recvPlan(fd int, p *execPlan) (fds []int, rest []byte, err error) {
	var data []byte
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	for len(data) < 4 || len(data) < 4+int(binary.BigEndian.Uint32(data)) {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fds, nil, err
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return fds, nil, err
			}
			for i := range msgs {
				rights, err := unix.ParseUnixRights(&msgs[i])
				if err != nil {
					return fds, nil, err
				}
				fds = append(fds, rights...)
			}
		}
		if n == 0 && oobn == 0 {
			if len(data) == 0 && len(fds) == 0 {
				return nil, nil, io.EOF
			}
			return fds, nil, io.ErrUnexpectedEOF
		}
		data = append(data, buf[:n]...)
	}
	if len(fds) != 3 {
		return fds, nil, fmt.Errorf("got %d descriptors, want 3", len(fds))
	}
	end := 4 + int(binary.BigEndian.Uint32(data))
	return fds, data[end:], json.Unmarshal(data[4:end], p)
}

// takeStdio makes fds the helper's 0, 1 and 2 (kept across execve) and,
// with ctty, fd 0 its controlling terminal, as Go's child does at a fork
// with Setctty and Ctty 0.
func takeStdio(fds []int, ctty bool) (string, error) {
	for i, fd := range fds {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return fmt.Sprintf("nsexec: take descriptor %d", i), err
		}
		unix.Close(fd)
	}
	if ctty {
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 1); err != nil {
			return "nsexec: set controlling terminal", err
		}
	}
	return "", nil
}
