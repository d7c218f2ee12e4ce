package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentrunner/runner/internal/atomicfile"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// The readiness protocol on the pipe Start hands the shim (fd 3): exactly
// one line, then the shim closes its end.
//
//	ready PID SHIMPID STARTED_UNIX_NANOS
//	error SHIMPID ERRNO PHASE MESSAGE
//
// ERRNO is the numeric errno of the start failure (0 if none), so ENOENT
// for a missing argv[0] survives the process boundary. PHASE is
// PhaseExec or PhaseSetup. A line without PHASE (`error SHIMPID ERRNO
// MESSAGE`, from a shim before phases) still parses, with Phase "".

// The phases of a start failure (StartError.Phase); see the readiness
// protocol above.
const (
	// PhaseExec is a failure of the caller's command itself: its
	// executable (PATH lookup, execve), its working directory, or its
	// run-as user's lookup. Retrying the same request fails the same way.
	PhaseExec = proto.PhaseExec
	// PhaseSetup is any other failure: the shim's own start, its
	// journal, control socket, network namespace, a fork that the host
	// refused (EAGAIN, ENOMEM). It says nothing about the request.
	PhaseSetup = proto.PhaseSetup
)

// StartError is returned by Start when the shim could not start the
// command. It unwraps to the errno when there was one, so
// errors.Is(err, fs.ErrNotExist) holds for a missing executable.
//
// Phase says whose failure it is; it is "" when no phase is known (an old
// shim's line, or a shim that exited without reporting). A StartError
// with ShimPID 0 and Phase "" came from no report at all: the shim may
// have got anywhere before it died, even past starting the command.
type StartError struct {
	Msg     string
	Errno   syscall.Errno // 0 if the failure had no errno
	ShimPID int           // the shim that reported it (it has exited or is exiting); 0 if none did
	Phase   string        // PhaseExec, PhaseSetup, or "" if unknown
}

func (e *StartError) Error() string { return e.Msg }

// Unwrap returns the errno, or nil.
func (e *StartError) Unwrap() error {
	if e.Errno == 0 {
		return nil
	}
	return e.Errno
}

// checkStart checks a start request, spec and dir, and returns dir made
// absolute.
func checkStart(dir string, spec sessiondir.Spec) (string, error) {
	if err := spec.Validate(); err != nil {
		return "", fmt.Errorf("start shim: %w", err)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("start shim: %w", err)
	}
	if _, err := sessiondir.SocketPath(dir); err != nil {
		return "", fmt.Errorf("start shim: %w", err)
	}
	return dir, nil
}

// startWith prepares the session directory dir (checked by checkStart)
// for spec, launches a shim of exe on it, and cleans up after a start
// error.
func startWith(ctx context.Context, exe []string, dir string, spec sessiondir.Spec) (sessiondir.Status, error) {
	created := false
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		created = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return sessiondir.Status{}, fmt.Errorf("start shim: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return sessiondir.Status{}, fmt.Errorf("start shim: %w", err)
	}
	specPath := filepath.Join(dir, sessiondir.SpecFile)
	b, err := json.Marshal(spec)
	if err != nil {
		return sessiondir.Status{}, fmt.Errorf("start shim: %w", err)
	}
	// Written to a temporary name and linked into place: the link fails if
	// a session is already there, even under a concurrent Start.
	if err := atomicfile.WriteFile(specPath+".new", b, 0o600); err != nil {
		return sessiondir.Status{}, fmt.Errorf("start shim: write spec: %w", err)
	}
	err = os.Link(specPath+".new", specPath)
	os.Remove(specPath + ".new")
	if errors.Is(err, fs.ErrExist) {
		return sessiondir.Status{}, fmt.Errorf("start shim %s: %w", dir, sessiondir.ErrExists)
	}
	if err != nil {
		return sessiondir.Status{}, fmt.Errorf("start shim: write spec: %w", err)
	}
	cleanup := func() {
		os.Remove(specPath)
		os.Remove(filepath.Join(dir, sessiondir.LogFile))
		if created {
			os.Remove(dir)
		}
	}

	st, err := launch(ctx, exe, dir)
	if err != nil {
		var se *StartError
		if errors.As(err, &se) {
			cleanup() // the shim removed its own files before reporting
		}
		return sessiondir.Status{}, err
	}
	st.ID, st.TTY = spec.ID, spec.TTY
	return st, nil
}

func launch(ctx context.Context, exe []string, dir string) (sessiondir.Status, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return sessiondir.Status{}, fmt.Errorf("start shim: %w", err)
	}
	defer r.Close()
	log, err := os.OpenFile(filepath.Join(dir, sessiondir.LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		w.Close()
		return sessiondir.Status{}, &StartError{Msg: fmt.Sprintf("start shim: open shim log: %v", err), Phase: proto.PhaseSetup}
	}
	defer log.Close()
	cmd, err := detachedCmd(exe, proto.ModeSession, "--ready-fd=3", dir)
	if err != nil {
		w.Close()
		return sessiondir.Status{}, &StartError{Msg: fmt.Sprintf("start shim %s: %v", exe[0], err), Phase: proto.PhaseSetup}
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{w}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return sessiondir.Status{}, &StartError{Msg: fmt.Sprintf("start shim %s: %v", exe[0], err), Phase: proto.PhaseSetup}
	}
	// The intermediate exits as soon as the real shim is started.
	werr := cmd.Wait()

	return awaitReady(ctx, r, werr)
}

// detachedCmd is the command that starts exe (the argv prefix that runs
// the supervisor's Main) in mode (a row of its table) with args as a
// detached shim: in a new session, through a
// short-lived intermediate that exits at once, so the shim is reparented
// away from the caller (to init, or the nearest subreaper) and outlives
// it. The intermediate is util-linux's setsid --fork when there is one (a
// C process start: about 1 ms of CPU on the CI VM, where a Go process
// start is about 4 ms, 390 page faults), else the shim's own --detach.
// Files the caller passes (ExtraFiles, Stdout, Stderr) reach the shim.
//
// A shim program that cannot be executed is an error here, before
// anything starts: through setsid its execve would fail in a child nobody
// waits for, and the caller could not tell that from a shim that died
// half-way through a start.
func detachedCmd(exe []string, mode string, args ...string) (*exec.Cmd, error) {
	if _, err := exec.LookPath(exe[0]); err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if setsid := detacher(); setsid != "" {
		cmd = exec.Command(setsid, append(append(append([]string{"--fork"}, exe...), mode), args...)...)
	} else {
		cmd = exec.Command(exe[0], append(append(append(append([]string{}, exe[1:]...), mode), "--detach"), args...)...)
	}
	cmd.Env = shimEnv(os.Environ())
	return cmd, nil
}

// shimEnv is the environment a shim starts with: the caller's, with
// GOMAXPROCS=1. An idle shim waits on a child, a socket and pipes; one P
// serves it, and set at start (rather than by setSmall's
// runtime.GOMAXPROCS(1), which comes after the runtime made a P per CPU
// and the package inits spread their allocations over them) it keeps
// about 0.37 MiB less private memory per shim on a 2-CPU host, more on a
// bigger one (docs/benchmarks.md). Commands never see it: a session's
// command gets Spec.Env alone.
func shimEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			out = append(out, kv)
		}
	}
	return append(out, "GOMAXPROCS=1")
}

// detacher returns the path of a setsid(1) that takes --fork, or "".
// A variable for tests.
var detacher = sync.OnceValue(func() string {
	p, err := exec.LookPath("setsid")
	if err != nil {
		return ""
	}
	out, _ := exec.Command(p, "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("--fork")) {
		return ""
	}
	return p
})

// awaitReady reads the readiness line from r (a pipe or socket that
// supports deadlines). werr is what is known of a process that exited on
// the way, for the message when nothing was reported.
func awaitReady(ctx context.Context, r interface {
	io.Reader
	SetReadDeadline(time.Time) error
}, werr error) (sessiondir.Status, error) {
	stop := context.AfterFunc(ctx, func() { r.SetReadDeadline(time.Now()) })
	defer stop()
	line, rerr := readLine(r, 4096)
	if ctx.Err() != nil {
		return sessiondir.Status{}, fmt.Errorf("start shim: wait for ready: %w", ctx.Err())
	}
	if rerr != nil || len(line) == 0 {
		return sessiondir.Status{}, &StartError{Msg: fmt.Sprintf("start shim: it exited without reporting (%v, %v)", werr, rerr)}
	}
	return parseReady(line)
}

func readLine(r io.Reader, max int) (string, error) {
	var buf []byte
	tmp := make([]byte, 512)
	for len(buf) < max {
		n, err := r.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			return string(buf[:i]), nil
		}
		if err != nil {
			if err == io.EOF {
				return string(buf), nil
			}
			return string(buf), err
		}
	}
	return string(buf), nil
}

func parseReady(line string) (sessiondir.Status, error) {
	f := strings.SplitN(line, " ", 4)
	switch {
	case f[0] == "ready" && len(f) == 4:
		pid, _ := strconv.Atoi(f[1])
		spid, _ := strconv.Atoi(f[2])
		ns, _ := strconv.ParseInt(f[3], 10, 64)
		return sessiondir.Status{State: sessiondir.StateRunning, PID: pid, ShimPID: spid, StartedAt: time.Unix(0, ns).UTC()}, nil
	case f[0] == "error" && len(f) == 4:
		spid, _ := strconv.Atoi(f[1])
		errno, _ := strconv.Atoi(f[2])
		se := &StartError{Msg: f[3], Errno: syscall.Errno(errno), ShimPID: spid}
		if phase, msg, ok := strings.Cut(f[3], " "); ok && (phase == proto.PhaseExec || phase == proto.PhaseSetup) {
			se.Phase, se.Msg = phase, msg
		}
		return sessiondir.Status{}, se
	}
	return sessiondir.Status{}, &StartError{Msg: fmt.Sprintf("start shim: bad readiness report %q", line)}
}
