package shim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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

// The phases of a start failure (StartError.Phase).
const (
	// PhaseExec is a failure of the caller's command itself: its
	// executable (PATH lookup, execve), its working directory, or its
	// run-as user's lookup. Retrying the same request fails the same way.
	PhaseExec = "exec"
	// PhaseSetup is any other failure: the shim's own start, its
	// journal, control socket, network namespace, a fork that the host
	// refused (EAGAIN, ENOMEM). It says nothing about the request.
	PhaseSetup = "setup"
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

// commandError marks a start failure of the caller's command (see
// PhaseExec); the shim reports it with that phase.
type commandError struct{ err error }

func (e *commandError) Error() string { return e.err.Error() }
func (e *commandError) Unwrap() error { return e.err }

// commandErrnos are the errnos of a fork/exec of the command that are its
// own (a missing or unrunnable executable or working directory), as
// opposed to the host's (EAGAIN, ENOMEM, EMFILE, ETXTBSY, EPERM of a
// setuid).
var commandErrnos = []syscall.Errno{syscall.ENOENT, syscall.EACCES, syscall.ENOEXEC, syscall.ENOTDIR,
	syscall.EISDIR, syscall.ELOOP, syscall.ENAMETOOLONG, syscall.E2BIG, syscall.ELIBBAD}

// asCommandError marks err as the command's when it is a fork/exec of the
// command that failed with one of commandErrnos.
func asCommandError(err error) error {
	var pe *os.PathError
	var en syscall.Errno
	if errors.As(err, &pe) && pe.Op == "fork/exec" && errors.As(err, &en) && slices.Contains(commandErrnos, en) {
		return &commandError{err}
	}
	return err
}

// phaseOf is the readiness line's PHASE for a start failure.
func phaseOf(err error) string {
	var ce *commandError
	if errors.As(err, &ce) {
		return PhaseExec
	}
	return PhaseSetup
}

func (e *StartError) Error() string { return e.Msg }

// Unwrap returns the errno, or nil.
func (e *StartError) Unwrap() error {
	if e.Errno == 0 {
		return nil
	}
	return e.Errno
}

// Start launches a detached shim for a new session in dir and returns once
// the command runs, or with its start error (a *StartError for failures of
// the command itself; ErrExists, ErrInvalid for the request). exe is the
// argv prefix that runs [Main] (e.g. {"/usr/local/bin/runner-shim",
// "serve"} or {os.Executable(), "shim"}); Start appends its own arguments.
//
// dir is created with mode 0700 if needed and must not already hold a
// session. The shim is started through a short-lived intermediate process
// that starts the real shim in a new session and exits at once, so the
// shim is reparented to init (or the nearest subreaper) and never becomes
// a zombie of the launcher.
//
// If ctx ends before the shim reports, Start returns ctx's error; the
// session may still start (ReadStatus tells).
func Start(ctx context.Context, exe []string, dir string, spec Spec) (Status, error) {
	if len(exe) == 0 {
		return Status{}, fmt.Errorf("start shim: %w: empty exe", ErrInvalid)
	}
	dir, err := checkStart(dir, spec)
	if err != nil {
		return Status{}, err
	}
	return startWith(ctx, exe, dir, spec)
}

// checkStart checks a start request, spec and dir, and returns dir made
// absolute.
func checkStart(dir string, spec Spec) (string, error) {
	if err := spec.validate(); err != nil {
		return "", fmt.Errorf("start shim: %w", err)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("start shim: %w", err)
	}
	if _, err := socketPath(dir); err != nil {
		return "", fmt.Errorf("start shim: %w", err)
	}
	return dir, nil
}

// startWith prepares the session directory dir (checked by checkStart)
// for spec, launches a shim of exe on it, and cleans up after a start
// error.
func startWith(ctx context.Context, exe []string, dir string, spec Spec) (Status, error) {
	created := false
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		created = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Status{}, fmt.Errorf("start shim: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return Status{}, fmt.Errorf("start shim: %w", err)
	}
	specPath := filepath.Join(dir, SpecFile)
	b, err := json.Marshal(spec)
	if err != nil {
		return Status{}, fmt.Errorf("start shim: %w", err)
	}
	// Written to a temporary name and linked into place: the link fails if
	// a session is already there, even under a concurrent Start.
	if err := writeFileAtomic(specPath+".new", b, 0o600); err != nil {
		return Status{}, fmt.Errorf("start shim: write spec: %w", err)
	}
	err = os.Link(specPath+".new", specPath)
	os.Remove(specPath + ".new")
	if errors.Is(err, fs.ErrExist) {
		return Status{}, fmt.Errorf("start shim %s: %w", dir, ErrExists)
	}
	if err != nil {
		return Status{}, fmt.Errorf("start shim: write spec: %w", err)
	}
	cleanup := func() {
		os.Remove(specPath)
		os.Remove(filepath.Join(dir, LogFile))
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
		return Status{}, err
	}
	st.ID, st.TTY = spec.ID, spec.TTY
	return st, nil
}

func launch(ctx context.Context, exe []string, dir string) (Status, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return Status{}, fmt.Errorf("start shim: %w", err)
	}
	defer r.Close()
	log, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		w.Close()
		return Status{}, &StartError{Msg: fmt.Sprintf("start shim: open shim log: %v", err), Phase: PhaseSetup}
	}
	defer log.Close()
	cmd, err := detachedCmd(exe, "--ready-fd=3", dir)
	if err != nil {
		w.Close()
		return Status{}, &StartError{Msg: fmt.Sprintf("start shim %s: %v", exe[0], err), Phase: PhaseSetup}
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{w}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return Status{}, &StartError{Msg: fmt.Sprintf("start shim %s: %v", exe[0], err), Phase: PhaseSetup}
	}
	// The intermediate exits as soon as the real shim is started.
	werr := cmd.Wait()

	return awaitReady(ctx, r, werr)
}

// detachedCmd is the command that starts exe (the argv prefix that runs
// [Main]) with args as a detached shim: in a new session, through a
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
func detachedCmd(exe []string, args ...string) (*exec.Cmd, error) {
	if _, err := exec.LookPath(exe[0]); err != nil {
		return nil, err
	}
	if setsid := detacher(); setsid != "" {
		return exec.Command(setsid, append(append([]string{"--fork"}, exe...), args...)...), nil
	}
	return exec.Command(exe[0], append(append(append([]string{}, exe[1:]...), "--detach"), args...)...), nil
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
}, werr error) (Status, error) {
	stop := context.AfterFunc(ctx, func() { r.SetReadDeadline(time.Now()) })
	defer stop()
	line, rerr := readLine(r, 4096)
	if ctx.Err() != nil {
		return Status{}, fmt.Errorf("start shim: wait for ready: %w", ctx.Err())
	}
	if rerr != nil || len(line) == 0 {
		return Status{}, &StartError{Msg: fmt.Sprintf("start shim: it exited without reporting (%v, %v)", werr, rerr)}
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

func parseReady(line string) (Status, error) {
	f := strings.SplitN(line, " ", 4)
	switch {
	case f[0] == "ready" && len(f) == 4:
		pid, _ := strconv.Atoi(f[1])
		spid, _ := strconv.Atoi(f[2])
		ns, _ := strconv.ParseInt(f[3], 10, 64)
		return Status{State: StateRunning, PID: pid, ShimPID: spid, StartedAt: time.Unix(0, ns).UTC()}, nil
	case f[0] == "error" && len(f) == 4:
		spid, _ := strconv.Atoi(f[1])
		errno, _ := strconv.Atoi(f[2])
		se := &StartError{Msg: f[3], Errno: syscall.Errno(errno), ShimPID: spid}
		if phase, msg, ok := strings.Cut(f[3], " "); ok && (phase == PhaseExec || phase == PhaseSetup) {
			se.Phase, se.Msg = phase, msg
		}
		return Status{}, se
	}
	return Status{}, &StartError{Msg: fmt.Sprintf("start shim: bad readiness report %q", line)}
}

// Main is the shim process's entry point (`runner-shim serve` and
// runnerd's hidden `shim` subcommand call it with the arguments after
// theirs). It returns the process exit status.
//
//	[--detach] [--ready-fd N] DIR
//	[--detach] --warm-fd N --warm-root ROOT [--warm-retain BYTES]
//
// --detach (used by Start) re-executes the same program without it in a
// new session and returns at once. --ready-fd names the inherited pipe for
// the readiness line. DIR is the session directory holding spec.json.
//
// --warm-fd (used by Pool) makes a warm shim: it prepares a staging
// directory ROOT/.warm-* (control socket, pipes journal retaining BYTES,
// pid file, its log), says "warm SHIMPID STAGE" on the inherited socket,
// then waits for two lines, the session directory (in ROOT, not existing
// yet) and the spec as JSON; it renames the staging directory to the
// session directory, prepares the command, and starts it on a third line,
// "go", answering the readiness line on the same socket (docs/frames.md,
// "Warm shims"). EOF before that (its pool closed it or cancelled the
// start, or the pool's process died) makes it remove what it made and
// exit 0.
//
// Main is also the shim's internal helper for Spec.ResolvConf: with the
// single argument "__runner_nsexec" it prepares a mount namespace and
// execs the command (see nsexec.go). It checks for that before parsing
// flags, so every program that calls Main first thing reaches the helper.
func Main(args []string) int {
	if isNsexec(args) {
		return nsexecMain()
	}
	setMainPrefix(args)
	fset := flag.NewFlagSet("shim", flag.ContinueOnError)
	detachFlag := fset.Bool("detach", false, "re-execute detached in a new session, then exit (used by Start)")
	readyFD := fset.Int("ready-fd", -1, "inherited file descriptor for the readiness line")
	warmFD := fset.Int("warm-fd", -1, "inherited socket: wait on it for the session directory (used by Pool)")
	warmRoot := fset.String("warm-root", "", "with --warm-fd: where session directories are made, and staged")
	warmRetain := fset.Int64("warm-retain", 0, "with --warm-fd: the staged journal's RetainBytes")
	if err := fset.Parse(args); err != nil {
		return 2
	}
	if *warmFD >= 0 {
		if fset.NArg() != 0 || *readyFD >= 0 || !filepath.IsAbs(*warmRoot) {
			fmt.Fprintln(os.Stderr, "shim: --warm-fd takes an absolute --warm-root, no directory and no --ready-fd")
			return 2
		}
		syscall.CloseOnExec(*warmFD)
		sock := os.NewFile(uintptr(*warmFD), "warm")
		if *detachFlag {
			return detach(args, "", sock)
		}
		return warmMain(sock, *warmRoot, *warmRetain)
	}
	if fset.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "shim: want exactly one session directory")
		return 2
	}
	dir := fset.Arg(0)
	var ready *os.File
	if *readyFD >= 0 {
		syscall.CloseOnExec(*readyFD) // never leak it into the command
		ready = os.NewFile(uintptr(*readyFD), "ready")
	}
	if *detachFlag {
		return detach(args, dir, ready)
	}

	setSmall()
	return serve(dir, ready)
}

// setSmall tunes the runtime for an idle shim: one P, a collector that
// runs often on a tiny heap, and the memory limit as a backstop.
func setSmall() {
	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(50)
	debug.SetMemoryLimit(8 << 20)
}

// warmMain is a warm shim's life: prepare a staging directory in root
// (control socket, journal for a pipes session retaining retain bytes, pid
// file), announce itself, wait for a session, move the staging directory
// into place and serve it like a shim started for it. Everything but the
// command's own start is done before the session exists, off its path.
func warmMain(sock *os.File, root string, retain int64) int {
	setSmall()
	stage, err := os.MkdirTemp(root, ".warm-")
	if err != nil {
		reportError(sock, PhaseSetup, err)
		return 1
	}
	// Its stderr goes to the staging directory's log, which becomes the
	// session's shim.log when the directory is moved.
	if log, err := os.OpenFile(filepath.Join(stage, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
		unix.Dup3(int(log.Fd()), 1, 0)
		unix.Dup3(int(log.Fd()), 2, 0)
		log.Close()
	}
	// Created without its fsyncs, which the Sync below does once the rest
	// is prepared (still before the shim says it is warm).
	staged := journalOptions(Spec{}, true)
	staged.RetainBytes = retain
	s, err := prepare(stage, staged)
	if err == nil {
		if err = s.stage(); err != nil {
			s.undo()
		}
	}
	if err != nil {
		os.RemoveAll(stage)
		reportError(sock, PhaseSetup, err)
		return 1
	}
	discard := func() { s.undo(); os.RemoveAll(s.dir) }
	// The socket is closed only once the staging directory is gone, so a
	// pool that waits for EOF (Pool.Close) knows it is.
	unused := func() int { discard(); sock.Close(); return 0 }
	prewarm()
	// The journal's creation made durable now, off any start's path:
	// otherwise the session's first sync point pays for it, which for a
	// short command is its Finish, on exec's path (~1 ms).
	if err := s.jw.Load().Sync(); err != nil {
		discard()
		reportError(sock, PhaseSetup, err)
		return 1
	}
	if _, err := fmt.Fprintf(sock, "warm %d %s\n", os.Getpid(), stage); err != nil {
		return unused()
	}
	// Two complete lines, the directory and the spec; EOF before them is
	// the pool going away (or closing us), and is ignored like a partial
	// line: the staging directory is removed and nothing else was touched.
	r := bufio.NewReaderSize(sock, 64<<10)
	dirLine, err := readFullLine(r, 4096)
	if err != nil {
		return unused()
	}
	specLine, err := readFullLine(r, maxSpecBytes)
	if err != nil {
		return unused()
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "shim %s: %v\n", dirLine, err)
		reportError(sock, phaseOf(err), err)
		return 1
	}
	var spec Spec
	if err := json.Unmarshal([]byte(specLine), &spec); err != nil {
		discard()
		return fail(fmt.Errorf("%w: decode spec: %v", ErrInvalid, err))
	}
	if err := spec.validate(); err != nil {
		discard()
		return fail(err)
	}
	if err := s.moveTo(dirLine); err != nil {
		discard()
		return fail(err)
	}
	// From here on this is dir's shim, and dir is ours: a failure removes
	// it whole, as a cold start's failure leaves nothing behind.
	if err := s.adopt(spec, staged); err != nil {
		discard()
		return fail(err)
	}
	// The command starts only on "go": the pool's owner records the
	// session durably meanwhile, and may instead cancel (EOF).
	gate := func() error {
		if line, err := readFullLine(r, 16); err != nil || line != "go" {
			return errCancelled
		}
		return nil
	}
	if err := s.start(spec, gate); errors.Is(err, errCancelled) {
		return unused()
	} else if err != nil {
		discard()
		return fail(err)
	}
	report(sock, fmt.Sprintf("ready %d %d %d", s.pid, os.Getpid(), s.at.UnixNano()))
	// The move is made durable off the start's path, with the first
	// bytes (run owns the goroutine).
	s.syncParent = root
	s.run()
	return 0
}

// errCancelled is a warm start its pool called off before the command
// started (Prepared.Cancel).
var errCancelled = errors.New("start cancelled")

// maxSpecBytes bounds the spec line a warm shim reads.
const maxSpecBytes = 16 << 20

// readFullLine reads one complete line of at most max bytes, without its
// newline; a partial line at EOF is an error.
func readFullLine(r *bufio.Reader, max int) (string, error) {
	var b []byte
	for {
		chunk, err := r.ReadSlice('\n')
		b = append(b, chunk...)
		if len(b) > max {
			return "", fmt.Errorf("line longer than %d bytes", max)
		}
		switch {
		case err == nil:
			return string(b[:len(b)-1]), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return "", err
		}
	}
}

// prewarm runs the code a start through a warm shim runs, on throwaway
// values, so that its first real use does not pay for page faults and
// type caches (about a millisecond in a fresh process).
func prewarm() {
	var spec Spec
	json.Unmarshal([]byte(`{"id":"w","argv":["true"],"env":["PATH=/usr/bin:/bin"],"cwd":"/","tty":false,"rows":24}`), &spec)
	json.Marshal(started{ShimPID: 1, PID: 1, StartedAt: time.Now()})
	lookPath("true", spec.Env, "/")
}

// serve runs the shim of dir, reporting readiness on ready (if not nil).
func serve(dir string, ready *os.File) int {
	s, err := newServer(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim %s: %v\n", dir, err)
		reportError(ready, phaseOf(err), err)
		return 1
	}
	report(ready, fmt.Sprintf("ready %d %d %d", s.pid, os.Getpid(), s.at.UnixNano()))
	s.run()
	return 0
}

func report(ready *os.File, line string) {
	if ready == nil {
		return
	}
	ready.WriteString(line + "\n")
	ready.Close()
}

// reportError reports a start failure: the readiness line's error form.
func reportError(ready *os.File, phase string, err error) {
	report(ready, fmt.Sprintf("error %d %d %s %s", os.Getpid(), errnoOf(err), phase, oneLine(err.Error())))
}

func errnoOf(err error) int {
	var en syscall.Errno
	if errors.As(err, &en) {
		return int(en)
	}
	return 0
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// detach starts the real shim in a new session with the same arguments
// minus --detach, its stderr in the session's shim.log, and returns without
// waiting: this process exits and the shim is reparented away.
//
// For a warm shim (dir empty) stdout and stderr are /dev/null until it is
// given a session.
func detach(args []string, dir string, ready *os.File) int {
	fail := func(err error) int {
		reportError(ready, PhaseSetup, err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(fmt.Errorf("find own executable: %w", err))
	}
	// The prefix that led to Main (e.g. "serve", "shim"; recorded by Main)
	// is kept.
	prefix := mainPrefix
	var rest []string
	for _, a := range args {
		if a != "--detach" && a != "-detach" {
			rest = append(rest, a)
		}
	}
	logPath := os.DevNull
	if dir != "" {
		logPath = filepath.Join(dir, LogFile)
	}
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(fmt.Errorf("open shim log: %w", err))
	}
	defer log.Close()
	cmd := &exec.Cmd{Path: exe, Args: append(append([]string{os.Args[0]}, prefix...), rest...),
		Stdout: log, Stderr: log, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if ready != nil {
		cmd.ExtraFiles = []*os.File{ready} // fd 3 in the shim, as the flag says
		if j := strings.Join(rest, " "); !strings.Contains(j, "--ready-fd=3") && !strings.Contains(j, "--warm-fd=3") {
			return fail(errors.New("detach: --ready-fd or --warm-fd must be 3"))
		}
	}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start shim: %w", err))
	}
	cmd.Process.Release()
	return 0
}
