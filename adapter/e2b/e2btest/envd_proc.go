package e2btest

// The processes behind envd's process service: one real process per Start,
// its subscribers, its stdin, its signals and its end.

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// proc is one real process in a sandbox.
type proc struct {
	s     *Server
	sb    *sandbox
	cmd   *exec.Cmd
	pid   uint32
	tag   string
	cfg   processConfig
	user  user
	chunk int

	pty     *os.File   // the master, nil without a PTY
	readers []*os.File // stdout and stderr read ends, or the master

	inMu  sync.Mutex     // guards stdin (writes and close)
	stdin io.WriteCloser // nil when there is none or it was closed

	timer    *time.Timer   // the lifetime, nil without one
	deadline chan struct{} // closed when the lifetime elapsed; nil without one
	done     chan struct{} // closed after the end event went out

	mu     sync.Mutex // guards subs, ended and reaped
	subs   map[*sub]struct{}
	ended  bool
	reaped bool
}

type sub struct {
	ch   chan message
	gone chan struct{}
}

type message struct {
	body []byte
	end  bool
}

// subscribeLocked adds a subscriber; the caller holds p.mu or p is not
// shared yet.
func (p *proc) subscribeLocked() *sub {
	me := &sub{ch: make(chan message), gone: make(chan struct{})}
	p.subs[me] = struct{}{}
	return me
}

func (p *proc) subscribe() (*sub, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, false
	}
	return p.subscribeLocked(), true
}

func (p *proc) unsubscribe(me *sub) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.subs[me]; ok {
		delete(p.subs, me)
		close(me.gone)
	}
}

// broadcast hands m to every current subscriber, waiting for each (a slow
// subscriber slows the process, as on envd) unless it leaves. With nobody
// subscribed the output is dropped.
func (p *proc) broadcast(m message) {
	p.mu.Lock()
	subs := make([]*sub, 0, len(p.subs))
	for me := range p.subs {
		subs = append(subs, me)
	}
	p.mu.Unlock()
	for _, me := range subs {
		select {
		case me.ch <- m:
		case <-me.gone:
		}
	}
}

func (p *proc) deadlineHit() bool {
	select {
	case <-p.deadline:
		return true
	default:
		return false
	}
}

// launch starts the process and its reader and waiter goroutines.
func (p *proc) launch(sb *sandbox, size *ptySize, stdin bool, lifetime time.Duration) *connectErr {
	s := p.s
	// envd runs every process under its wrapper shell, so a program that
	// is missing is a started process that exits 127, not a start error.
	cmd := exec.Command("/bin/sh", append([]string{"-c", envdWrapper, "--", p.cfg.Cmd}, p.cfg.Args...)...)
	// The default working directory is the sandbox's, which stands for
	// /home/user (envd's default workdir, whoever the user); a cwd that
	// does not exist is invalid_argument before any start event.
	cmd.Dir = sb.dir
	if p.cfg.Cwd != nil && *p.cfg.Cwd != "" {
		cmd.Dir = *p.cfg.Cwd
		if _, err := os.Stat(cmd.Dir); errors.Is(err, os.ErrNotExist) {
			return cerr("invalid_argument", "cwd '%s' does not exist", cmd.Dir)
		}
	}
	// A clean environment, as envd builds it: its own PATH, the user's
	// HOME, USER and LOGNAME, its defaults (E2B_SANDBOX, "true" in a
	// Firecracker VM), the sandbox's variables, the request's; and the
	// stand-in's tag, so the sandbox's processes can be found.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + p.user.home, "USER=" + p.user.name, "LOGNAME=" + p.user.name,
		"E2B_SANDBOX=true", TagEnv + "=" + sb.id}
	for k, v := range sb.envVars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range p.cfg.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	if size != nil {
		master, slave, err := standin.OpenPTY(uint16(size.Rows), uint16(size.Cols))
		if err != nil {
			return cerr("internal", "error starting pty: %v", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		p.user.credential(cmd.SysProcAttr)
		p.pty = master
		p.readers = []*os.File{master}
		childEnds = []*os.File{slave}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		p.user.credential(cmd.SysProcAttr)
		for range 2 {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(p.readers)
				closeAll(childEnds)
				return cerr("internal", "error creating pipe: %v", err)
			}
			p.readers = append(p.readers, r)
			childEnds = append(childEnds, w)
		}
		cmd.Stdout, cmd.Stderr = childEnds[0], childEnds[1]
		if stdin {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(p.readers)
				closeAll(childEnds)
				return cerr("internal", "error creating pipe: %v", err)
			}
			cmd.Stdin = r
			childEnds = append(childEnds, r)
			p.stdin = w
		}
	}
	if err := cmd.Start(); err != nil {
		closeAll(p.readers)
		closeAll(childEnds)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return cerr("internal", "error starting process: %v", err)
	}
	closeAll(childEnds)
	p.cmd = cmd
	p.pid = uint32(cmd.Process.Pid)
	if d := s.opts.RegisterDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
		}
	}

	s.mu.Lock()
	alive := sb.procs != nil && s.sandboxes[sb.id] == sb
	if alive {
		sb.procs[p.pid] = p
	}
	s.mu.Unlock()
	if !alive {
		p.kill()
	}
	if lifetime > 0 {
		p.deadline = make(chan struct{})
		p.timer = time.AfterFunc(lifetime, func() {
			close(p.deadline)
			// envd's exec.CommandContext kills the process, not its
			// group: what it started lives on.
			p.killPID()
		})
	}
	var readers sync.WaitGroup
	for i, f := range p.readers {
		field := [...]string{"stdout", "stderr"}[i]
		if p.pty != nil {
			field = "pty"
		}
		readers.Add(1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer readers.Done()
			p.read(f, field)
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		readers.Wait()
		p.wait()
	}()
	return nil
}

// read forwards output in chunks of at most p.chunk bytes.
func (p *proc) read(f *os.File, field string) {
	if f != p.pty {
		defer f.Close()
	}
	// The PTY master stays open until the process is reaped (wait closes
	// it): closing it earlier hangs the terminal up under a process that
	// is still running.
	buf := make([]byte, p.chunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			b, _ := json.Marshal(map[string]any{"event": map[string]any{"data": map[string][]byte{field: buf[:n]}}})
			p.broadcast(message{body: b})
		}
		if err != nil {
			// EOF for a pipe; EIO for a PTY master once the terminal's
			// last holder closed it.
			return
		}
	}
}

// wait reaps the process and sends the end event, as envd reports it from
// os.ProcessState (protojson leaves out zero fields).
func (p *proc) wait() {
	// Wait for the exit without reaping, mark the process reaped, then
	// reap: group signals (kill, pause) check the mark under p.mu, so none
	// is ever sent to a process group whose id the kernel may reuse.
	waitNoReap(p.pid)
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()
	err := p.cmd.Wait()
	if p.timer != nil {
		p.timer.Stop()
	}
	p.inMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	if p.pty != nil {
		p.pty.Close()
	}
	end := map[string]any{}
	st := p.cmd.ProcessState
	if code := st.ExitCode(); code != 0 {
		end["exitCode"] = code
	}
	if st.Exited() {
		end["exited"] = true
	}
	end["status"] = st.String()
	// envd sends cmd.Wait's error text: "exit status 3", "signal:
	// terminated".
	if err != nil {
		end["error"] = err.Error()
	}
	b, _ := json.Marshal(map[string]any{"event": map[string]any{"end": end}})
	p.s.mu.Lock()
	if p.sb.procs[p.pid] == p {
		delete(p.sb.procs, p.pid)
		p.sb.retain(p, b)
	}
	p.s.mu.Unlock()
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
	p.broadcast(message{body: b, end: true})
	close(p.done)
}

func (p *proc) input(in *processInput) *connectErr {
	if in == nil {
		return cerr("unimplemented", "invalid input type")
	}
	if in.PTY != nil {
		if p.pty == nil {
			return cerr("internal", "error writing to tty: tty not assigned to process")
		}
		if _, err := p.pty.Write(in.PTY); err != nil {
			return cerr("internal", "error writing to tty: %v", err)
		}
		return nil
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return cerr("internal", "error writing to stdin: stdin not enabled or closed")
	}
	if _, err := p.stdin.Write(in.Stdin); err != nil {
		return cerr("internal", "error writing to stdin: %v", err)
	}
	return nil
}

func (p *proc) closeStdin() *connectErr {
	if p.pty != nil {
		return cerr("unknown", "error closing stdin: cannot close stdin for PTY process, send Ctrl+D (0x04) instead")
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		// envd answers a second CloseStdin, and one for a process started
		// with stdin: false, with success.
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	if err != nil {
		return cerr("unknown", "error closing stdin: %v", err)
	}
	return nil
}

func (p *proc) signal(v any) *connectErr {
	var sig syscall.Signal
	switch v {
	case "SIGNAL_SIGKILL", float64(9):
		sig = syscall.SIGKILL
	case "SIGNAL_SIGTERM", float64(15):
		sig = syscall.SIGTERM
	default:
		return cerr("invalid_argument", "invalid signal: %v", v)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return cerr("internal", "error sending signal: %v", err)
	}
	return nil
}

// killPID kills the process alone, while it is not yet reaped.
func (p *proc) killPID() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil && !p.reaped {
		_ = p.cmd.Process.Kill()
	}
}

// kill ends the process's whole group (its own session for a PTY).
func (p *proc) kill() { p.signalGroup(syscall.SIGKILL) }

// abort kills the group and closes the output read ends, so the readers
// finish even when a descendant outside the group still holds the pipes.
func (p *proc) abort() {
	p.kill()
	for _, f := range p.readers {
		f.Close()
	}
}

// signalGroup signals the process's group while its leader is not yet
// reaped (its id cannot have been reused).
func (p *proc) signalGroup(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil && !p.reaped {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// waitNoReap blocks until pid exits, leaving it a zombie (waitid with
// WNOWAIT; the syscall package has no wrapper).
func waitNoReap(pid uint32) {
	const pPID, wExited, wNoWait = 1, 0x4, 0x1000000
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}

// envdWrapper is envd's wrapper script without its oom_score_adj, ionice
// and nice steps (which need privileges or tools a test host may lack):
// /bin/sh -c '... exec "${@}"' -- cmd args....
const envdWrapper = `exec "${@}"`

// retentionTTL is how long envd keeps an ended process's end event for
// Connect.
const retentionTTL = 30 * time.Second

// ended is a retained end event.
type ended struct {
	pid  uint32
	tag  string
	end  []byte
	when time.Time
}

// retain keeps p's end event for Connect; the caller holds s.mu.
func (sb *sandbox) retain(p *proc, end []byte) {
	now := time.Now()
	sb.ended = slices.DeleteFunc(sb.ended, func(e ended) bool {
		return now.Sub(e.when) > retentionTTL || e.pid == p.pid || p.tag != "" && e.tag == p.tag
	})
	sb.ended = append(sb.ended, ended{pid: p.pid, tag: p.tag, end: end, when: now})
}

// terminated returns the retained end event the selector names.
func (s *Server) terminated(sb *sandbox, sel *selector) (uint32, []byte, bool) {
	if sel == nil {
		return 0, nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range slices.Backward(sb.ended) {
		if time.Since(e.when) <= retentionTTL && (sel.PID != nil && *sel.PID == e.pid || sel.Tag != nil && *sel.Tag != "" && *sel.Tag == e.tag) {
			return e.pid, e.end, true
		}
	}
	return 0, nil, false
}

// user is a sandbox user envd runs processes as.
type user struct {
	name string
	uid  int
	home string
}

// canSwitch is whether the stand-in can run processes as another user
// (it runs as root); else every process runs as the test's own uid.
var canSwitch = os.Geteuid() == 0

// credential runs a process as u when the stand-in can switch users.
func (u user) credential(attr *syscall.SysProcAttr) {
	if canSwitch {
		attr.Credential = &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.uid)}
	}
}

// own gives path to u when the stand-in can switch users, as envd
// chowns what it writes.
func (u user) own(path string) error {
	if !canSwitch {
		return nil
	}
	return os.Lchown(path, u.uid, u.uid)
}

// The users of E2B's base image: /init's default "user" (uid 2001) and
// root.
var users = map[string]user{
	"user": {name: "user", uid: 2001, home: "/home/user"},
	"root": {name: "root", uid: 0, home: "/root"},
}

// authUser is envd's user: HTTP Basic's user name (any password), or the
// default user without one; an unknown name is refused.
func authUser(r *http.Request) (user, bool) {
	name, _, ok := r.BasicAuth()
	if !ok {
		name = "user"
	}
	u, ok := users[name]
	return u, ok
}
