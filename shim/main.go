package shim

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/sessiondir"
	"golang.org/x/sys/unix"
)

// Main is the supervisor process's entry point: the program that runs it
// (`runner-shim serve`, runnerd's hidden `shim` subcommand) calls it with
// the arguments after its own and with its Hooks, and exits with what it
// returns. The first argument names the mode, a row of modes:
//
//	session [--detach] [--ready-fd N] DIR
//	warm [--detach] --warm-fd N --warm-root ROOT [--warm-retain BYTES] [--warm-nsexec]
//	__runner_nsexec
//	__runner_nsexec_ahead
//	pod
//
// session (what a cold start runs) supervises the session in DIR, which
// holds spec.json. --detach re-executes the same program without it in a
// new session and returns at once; --ready-fd names the inherited pipe
// for the readiness line.
//
// warm (what Pool runs) makes a warm shim: it prepares a staging
// directory ROOT/.warm-* (control socket, pipes journal retaining BYTES,
// pid file, its log), says "warm SHIMPID STAGE" on the inherited socket,
// then waits for two lines, the session directory (in ROOT, not existing
// yet) and the spec as JSON; it renames the staging directory to the
// session directory, prepares the command, and starts it on a third line,
// "go", answering the readiness line on the same socket (docs/frames.md,
// "Warm shims"). EOF before that (its pool closed it or cancelled the
// start, or the pool's process died) makes it remove what it made and
// exit 0. --warm-nsexec makes it start the nsexec helper ahead
// (nsexec.go) as its first act and wait for it to be up before it says
// it is warm, so a command that needs the helper does not pay for the
// helper's process start; a command that does not gets it killed.
//
// pod is a pod's holder (package pod: pod.Create starts it, with the
// namespaces and the plan; pod.HolderMain is the whole mode).
//
// The two __runner_nsexec modes are the shim's own helper (nsexec.go),
// which the shim starts from /proc/self/exe: always this same program.
//
// Arguments that name no mode are the argv of a launcher from before the
// table (flags, then DIR): a runnerd that is still running while its
// runner-shim binary is replaced by a newer one starts shims that way
// until it is restarted, so legacyMode keeps reading it.
func Main(args []string, hooks Hooks) int {
	if len(args) > 0 {
		for _, m := range modes {
			if args[0] == m.name {
				setMainPrefix(args)
				return m.run(args[1:], hooks)
			}
		}
	}
	setMainPrefix(args)
	return legacyMode(args, hooks)
}

// mode is one row of Main's table.
type mode struct {
	name string
	run  func(args []string, hooks Hooks) int
}

// modes is Main's table (see Main).
var modes = []mode{
	{proto.ModeSession, sessionMode},
	{proto.ModeWarm, warmMode},
	{nsexecArg, func([]string, Hooks) int { return nsexecMain(false) }},
	{nsexecAheadArg, func([]string, Hooks) int { return nsexecMain(true) }},
	{modePod, func(args []string, _ Hooks) int { return pod.HolderMain(args) }},
}

// modePod is the pod holder's mode (package pod: pod.Create starts it).
const modePod = "pod"

// sessionMode is Main's session mode: [--detach] [--ready-fd N] DIR.
func sessionMode(args []string, hooks Hooks) int {
	fset := flag.NewFlagSet("shim session", flag.ContinueOnError)
	detachFlag := fset.Bool("detach", false, "re-execute detached in a new session, then exit")
	readyFD := fset.Int("ready-fd", -1, "inherited file descriptor for the readiness line")
	if err := fset.Parse(args); err != nil {
		return 2
	}
	return session(proto.ModeSession, args, *detachFlag, *readyFD, fset.Args(), hooks)
}

// session runs a session's shim (or its detaching intermediate) once its
// arguments are parsed: rest must be the session directory alone.
func session(mode string, args []string, detachFlag bool, readyFD int, rest []string, hooks Hooks) int {
	if len(rest) != 1 {
		fmt.Fprintln(os.Stderr, "shim: want exactly one session directory")
		return 2
	}
	dir := rest[0]
	var ready *os.File
	if readyFD >= 0 {
		syscall.CloseOnExec(readyFD) // never leak it into the command
		ready = os.NewFile(uintptr(readyFD), "ready")
	}
	if detachFlag {
		return detach(mode, args, dir, ready)
	}
	setSmall()
	return serve(dir, ready, hooks)
}

// warmFlags are the warm mode's flags.
type warmFlags struct {
	fd     *int
	root   *string
	retain *int64
	nsexec *bool
}

func addWarmFlags(fset *flag.FlagSet) warmFlags {
	return warmFlags{
		fd:     fset.Int("warm-fd", -1, "inherited socket: wait on it for the session directory"),
		root:   fset.String("warm-root", "", "where session directories are made, and staged"),
		retain: fset.Int64("warm-retain", 0, "the staged journal's RetainBytes"),
		nsexec: fset.Bool("warm-nsexec", false, "start the nsexec helper ahead, while waiting"),
	}
}

// warmMode is Main's warm mode: [--detach] --warm-fd N --warm-root ROOT
// [--warm-retain BYTES] [--warm-nsexec].
func warmMode(args []string, hooks Hooks) int {
	fset := flag.NewFlagSet("shim warm", flag.ContinueOnError)
	detachFlag := fset.Bool("detach", false, "re-execute detached in a new session, then exit")
	wf := addWarmFlags(fset)
	if err := fset.Parse(args); err != nil {
		return 2
	}
	return warm(proto.ModeWarm, args, *detachFlag, wf, fset.NArg() != 0, hooks)
}

// warm runs a warm shim (or its detaching intermediate) once its
// arguments are parsed; bad says the arguments were not a warm shim's.
func warm(mode string, args []string, detachFlag bool, wf warmFlags, bad bool, hooks Hooks) int {
	if bad || *wf.fd < 0 || !filepath.IsAbs(*wf.root) {
		fmt.Fprintln(os.Stderr, "shim: --warm-fd takes an absolute --warm-root, no directory and no --ready-fd")
		return 2
	}
	syscall.CloseOnExec(*wf.fd)
	sock := os.NewFile(uintptr(*wf.fd), "warm")
	if detachFlag {
		return detach(mode, args, "", sock)
	}
	return warmMain(sock, *wf.root, *wf.retain, *wf.nsexec, hooks)
}

// legacyMode reads the argv of a launcher from before Main's table (see
// Main): the session and warm flags in one set, a warm shim when
// --warm-fd is given. The detaching intermediate re-executes in the same
// form, so the pair never mixes the two.
func legacyMode(args []string, hooks Hooks) int {
	fset := flag.NewFlagSet("shim", flag.ContinueOnError)
	detachFlag := fset.Bool("detach", false, "re-execute detached in a new session, then exit")
	readyFD := fset.Int("ready-fd", -1, "inherited file descriptor for the readiness line")
	wf := addWarmFlags(fset)
	if err := fset.Parse(args); err != nil {
		return 2
	}
	if *wf.fd >= 0 {
		return warm("", args, *detachFlag, wf, fset.NArg() != 0 || *readyFD >= 0, hooks)
	}
	return session("", args, *detachFlag, *readyFD, fset.Args(), hooks)
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
func warmMain(sock *os.File, root string, retain int64, nsexec bool, hooks Hooks) int {
	setSmall()
	// First, so its process start overlaps the staging below. Without
	// one (it could not start, or never came up) a command that needs the
	// helper forks one at its start, as a cold shim's does.
	var ahead *nsexecAhead
	if nsexec {
		var err error
		if ahead, err = startNsexecAhead(); err != nil {
			fmt.Fprintf(os.Stderr, "shim: %v\n", err)
		}
	}
	// Every return below but the start's own discards it (startWith does
	// then), killed and reaped: never left behind.
	defer ahead.discard()
	stage, err := os.MkdirTemp(root, ".warm-")
	if err != nil {
		reportError(sock, proto.PhaseSetup, err)
		return 1
	}
	// Its stderr goes to the staging directory's log, which becomes the
	// session's shim.log when the directory is moved.
	if log, err := os.OpenFile(filepath.Join(stage, sessiondir.LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
		unix.Dup3(int(log.Fd()), 1, 0)
		unix.Dup3(int(log.Fd()), 2, 0)
		log.Close()
	}
	// Created without its fsyncs, which the Sync below does once the rest
	// is prepared (still before the shim says it is warm).
	staged := journalOptions(sessiondir.Spec{}, true)
	staged.RetainBytes = retain
	s, err := prepare(stage, staged)
	if err == nil {
		s.hooks = hooks
		if err = s.stage(); err != nil {
			s.undo()
		}
	}
	if err != nil {
		os.RemoveAll(stage)
		reportError(sock, proto.PhaseSetup, err)
		return 1
	}
	discard := func() { s.undo(); os.RemoveAll(s.dir) }
	// The socket is closed only once the staging directory is gone, so a
	// pool that waits for EOF (Pool.Close) knows it is.
	unused := func() int { discard(); sock.Close(); return 0 }
	prewarm()
	if err := setTitle("runner-shim warm", "shim warm"); err != nil {
		fmt.Fprintf(os.Stderr, "shim: %v\n", err)
	}
	// The journal's creation made durable now, off any start's path:
	// otherwise the session's first sync point pays for it, which for a
	// short command is its Finish, on exec's path (~1 ms).
	if err := s.jw.Load().Sync(); err != nil {
		discard()
		reportError(sock, proto.PhaseSetup, err)
		return 1
	}
	if ahead != nil {
		if err := ahead.awaitUp(nsexecUpTimeout); err != nil {
			fmt.Fprintf(os.Stderr, "shim: %v\n", err)
			ahead.discard()
			ahead = nil
		}
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
		reportError(sock, proto.PhaseOf(err), err)
		return 1
	}
	var spec sessiondir.Spec
	if err := json.Unmarshal([]byte(specLine), &spec); err != nil {
		discard()
		return fail(fmt.Errorf("%w: decode spec: %v", sessiondir.ErrInvalid, err))
	}
	if err := spec.Validate(); err != nil {
		discard()
		return fail(err)
	}
	retitle(spec)
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
	if err := s.startWith(spec, gate, ahead); errors.Is(err, errCancelled) {
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
	var spec sessiondir.Spec
	json.Unmarshal([]byte(`{"id":"w","argv":["true"],"env":["PATH=/usr/bin:/bin"],"cwd":"/","tty":false,"rows":24}`), &spec)
	json.Marshal(sessiondir.Started{ShimPID: 1, PID: 1, StartedAt: time.Now()})
	lookPath("true", spec.Env, "/")
}

// serve runs the shim of dir, reporting readiness on ready (if not nil).
func serve(dir string, ready *os.File, hooks Hooks) int {
	s, err := newServer(dir, hooks)
	if err != nil {
		fmt.Fprintf(os.Stderr, "shim %s: %v\n", dir, err)
		reportError(ready, proto.PhaseOf(err), err)
		return 1
	}
	retitle(s.spec)
	report(ready, fmt.Sprintf("ready %d %d %d", s.pid, os.Getpid(), s.at.UnixNano()))
	s.run()
	return 0
}

// retitle names spec's session in this shim's process title (title.go);
// a failure is logged, and the shim serves the same without a title.
func retitle(spec sessiondir.Spec) {
	if err := setTitle(titleFor(spec.Sandbox, spec.ID), commFor(spec.Sandbox, spec.ID)); err != nil {
		fmt.Fprintf(os.Stderr, "shim %s: %v\n", spec.ID, err)
	}
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
func detach(mode string, args []string, dir string, ready *os.File) int {
	fail := func(err error) int {
		reportError(ready, proto.PhaseSetup, err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(fmt.Errorf("find own executable: %w", err))
	}
	// The prefix that led to Main (e.g. "serve", "shim"; recorded by Main)
	// is kept.
	prefix := mainPrefix
	if mode != "" {
		prefix = append(slices.Clone(prefix), mode)
	}
	var rest []string
	for _, a := range args {
		if a != "--detach" && a != "-detach" {
			rest = append(rest, a)
		}
	}
	logPath := os.DevNull
	if dir != "" {
		logPath = filepath.Join(dir, sessiondir.LogFile)
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
