package cli

// runner exec and runner run: start a command as a session and follow it
// as it writes (spawn, then attach), rejoining across runnerd restarts,
// and exit with its code.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// newID returns a session id for exec, so that runner can name the session
// if the answer never arrives.
func newID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// execJSON is what exec --json prints. stdout and stderr are raw bytes,
// so they are base64 (standard encoding, with padding), and the field
// names say so; the flags are always present.
type execJSON struct {
	Session         string    `json:"session"`
	StdoutBase64    []byte    `json:"stdout_base64"`
	StderrBase64    []byte    `json:"stderr_base64"`
	StdoutTruncated bool      `json:"stdout_truncated"`
	StderrTruncated bool      `json:"stderr_truncated"`
	TimedOut        bool      `json:"timed_out"`
	Exit            wire.Exit `json:"exit"`
}

// sameFile reports whether a and b are one open file (a terminal, or
// one pipe or file after 2>&1): then the order of stdout and stderr is
// all a reader of it can see, and exec asks for one merged stream.
func sameFile(a, b *os.File) bool {
	var sa, sb syscall.Stat_t
	if syscall.Fstat(int(a.Fd()), &sa) != nil || syscall.Fstat(int(b.Fd()), &sb) != nil {
		return false
	}
	if sa.Mode&syscall.S_IFMT == syscall.S_IFCHR && !term.IsTerminal(int(a.Fd())) {
		return false // /dev/null: nobody reads it; the journal keeps both streams
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// retryUnavailable runs call and, while it fails unavailable (runnerd
// restarting, a cut connection), runs it again for up to reconnectFor,
// saying so once. Only for calls that are safe to repeat: a spawn with
// its id, a close-stdin.
func retryUnavailable(ctx context.Context, e *env, id string, call func(context.Context) error) error {
	var lostAt time.Time
	backoff := 250 * time.Millisecond
	for {
		cctx, cancel := e.callCtx(ctx)
		err := call(cctx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, adapter.ErrUnavailable) {
			return err
		}
		var api *client.APIError
		if errors.As(err, &api) && api.Exhausted {
			return err // nothing was created; waiting does not make room
		}
		if lostAt.IsZero() {
			lostAt = time.Now()
			msg := fmt.Sprintf("connection to runnerd lost; rejoining session %s (the command keeps running)...", id)
			if e.g.json {
				writeJSONWarning(e, msg)
			} else {
				fmt.Fprintf(e.io.err, "runner: %s\n", msg)
			}
		} else if reconnectGiveUp(lostAt) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// execFlags are exec's and run's flags.
type execFlags struct {
	env            envFlags
	cwd, id, dkey  *string
	stdin, tty     *bool
	maxTime        *time.Duration
	ttyDefaultAuto bool // run: -t and -i default to "runner's stdin is a terminal"
}

func registerExecFlags(fs *flag.FlagSet, f *execFlags) {
	registerEnvFlags(fs, &f.env)
	f.cwd = fs.String("cwd", "", "working directory, relative to the workspace")
	f.id = fs.String("id", "", "session id (default: exec-<random>); a retry with the same id never runs twice")
	f.stdin = fs.Bool("i", false, "interactive: send runner's stdin to the command as it is typed or read (its EOF closes the command's stdin)")
	f.tty = fs.Bool("t", false, "run the command on a terminal (a PTY); with -i this terminal becomes it (raw mode, size followed)")
	f.dkey = fs.String("detach-key", "ctrl-]", `with -it: the key that detaches, leaving the command running: ctrl-X, or "none"`)
	f.maxTime = fs.Duration("max-time", 0, "terminate the command (SIGTERM, SIGKILL 1 s later) after this long (0: no limit)")
}

func execCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	f := &execFlags{}
	registerExecFlags(fs, f)
	return func(ctx context.Context, e *env, pos, argv []string) error {
		return execBody(ctx, e, fs, f, "exec "+pos[0], pos[0], argv)
	}
}

func runCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	f := &execFlags{ttyDefaultAuto: true}
	registerExecFlags(fs, f)
	return func(ctx context.Context, e *env, pos, argv []string) error {
		name := pos[0]
		c, err := e.client()
		if err != nil {
			return err
		}
		cctx, cancel := e.callCtx(ctx)
		_, err = c.CreateSandbox(cctx, wire.CreateSandbox{Name: name})
		cancel()
		if err != nil {
			return fail("create "+name, err)
		}
		if *f.id != "" {
			if done, err := rejoin(ctx, e, c, fs, f, name, argv); done {
				return err
			}
		}
		return execBody(ctx, e, fs, f, "run "+name, name, argv)
	}
}

// rejoin is run --id as tmux new -A: a running session of that id and
// command is attached to, whatever its terminal, size or environment (a
// spawn --tty shell included); one that has ended is removed, and run
// starts the command afresh (saying so). done is false when run should
// go on and start the session (none of that id, or one running another
// command, which the spawn refuses naming what differs).
func rejoin(ctx context.Context, e *env, c *client.Client, fs *flag.FlagSet, f *execFlags, name string, argv []string) (done bool, err error) {
	id, what := *f.id, "run "+name
	cctx, cancel := e.callCtx(ctx)
	s, err := c.Session(cctx, name, id)
	cancel()
	switch {
	case errors.Is(err, adapter.ErrNotFound):
		return false, nil
	case err != nil:
		return true, fail(what, err)
	case s.State == wire.SessionRunning && !slices.Equal(s.Argv, argv):
		return false, nil
	case s.State != wire.SessionRunning:
		msg := fmt.Sprintf("session %s %s; starting it again (its output is replaced)", id, endedText(s))
		if e.g.json {
			writeJSONWarning(e, msg)
		} else {
			fmt.Fprintf(e.io.err, "runner: %s\n", msg)
		}
		dctx, dcancel := context.WithTimeout(ctx, e.g.timeout+10*time.Second)
		err := c.DeleteSession(dctx, name, id)
		dcancel()
		if err != nil {
			ce := &cliError{what: what, err: err}
			if r, ok := reasonOf(err); ok && r == wire.ReasonSessionRunning {
				ce.hint = fmt.Sprintf("processes the old session started still run: runner terminate %s %s, or pick another --id", name, id)
			}
			return true, ce
		}
		return false, nil
	}
	key, useKey, kerr := parseDetachKey(*f.dkey)
	if kerr != nil {
		return true, usagef("run", "%v", kerr)
	}
	stdin := *f.stdin || !flagsSet(fs)["i"] // run's -i defaults on
	r, err := e.follow(ctx, c, followOpts{what: what, name: name, id: id, s: s, key: key, useKey: useKey,
		stdin: stdin, exec: true, maxTime: *f.maxTime})
	if err != nil {
		return true, err
	}
	return true, e.endOf(ctx, c, what, name, r.frame)
}

// execBody starts argv as a session of sandbox name and follows it to
// its end: exec, and run after its create.
// execPlan is what exec and run ask for, from their flags: the session
// to start, the detach key, and whether runner's stdin goes to it.
type execPlan struct {
	req    wire.CreateSession
	key    byte
	useKey bool
	stdin  bool
}

// plan reads the flags of exec or run (fs) for the command argv; a
// mistake is a usage error of that command.
func (f *execFlags) plan(e *env, fs *flag.FlagSet, argv []string) (execPlan, error) {
	cmd := fs.Name()[len("runner "):]
	key, useKey, err := parseDetachKey(*f.dkey)
	if err != nil {
		return execPlan{}, usagef(cmd, "%v", err)
	}
	if *f.maxTime < 0 {
		return execPlan{}, usagef(cmd, "--max-time %s: want a duration >= 0", *f.maxTime)
	}
	tty, stdin := *f.tty, *f.stdin
	if f.ttyDefaultAuto {
		set := flagsSet(fs)
		isTerm := term.IsTerminal(int(e.io.in.Fd()))
		if !set["t"] {
			tty = isTerm
		}
		if !set["i"] {
			stdin = true
		}
	}
	envs, err := f.env.resolve(cmd)
	if err != nil {
		return execPlan{}, err
	}
	req := wire.CreateSession{ID: *f.id, Argv: argv, Env: envs, Cwd: *f.cwd, TTY: tty}
	if req.ID == "" {
		req.ID = newID("exec-")
	}
	if tty {
		if fd, ok := terminalFd(e); ok {
			if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
				req.Rows, req.Cols = h, w
			}
		}
	} else if !e.g.json && sameFile(e.io.out, e.io.err) {
		// Whoever reads runner's output sees one stream: give the
		// command one pipe, so the order it wrote in is the order shown.
		req.MergeStderr = true
	}
	return execPlan{req: req, key: key, useKey: useKey, stdin: stdin}, nil
}

func execBody(ctx context.Context, e *env, fs *flag.FlagSet, f *execFlags, what, name string, argv []string) error {
	p, err := f.plan(e, fs, argv)
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	// A session of runner's own random id is this runner's whoever's
	// attempt created it; one named with --id only when this call did.
	s, owned, err := e.execStart(ctx, c, what, name, p.req, *f.id == "")
	if err != nil {
		return err
	}
	if !p.stdin && !p.req.TTY {
		// The command reads EOF at once, as from </dev/null.
		err := retryUnavailable(ctx, e, p.req.ID, func(cctx context.Context) error { return c.CloseStdin(cctx, name, s.ID) })
		if err != nil && !errors.Is(err, adapter.ErrCommandExited) {
			return &cliError{what: what, err: err, hint: fmt.Sprintf("the command runs with its stdin open: runner close-stdin %s %s", name, s.ID)}
		}
	}

	var outBuf, errBuf bytes.Buffer
	o := followOpts{what: what, name: name, id: s.ID, s: s, key: p.key, useKey: p.useKey,
		stdin: p.stdin, exec: true, owned: owned, maxTime: *f.maxTime}
	if e.g.json {
		o.out, o.errw = &outBuf, &errBuf
	}
	r, err := e.follow(ctx, c, o)
	if err != nil {
		return err
	}
	if r.timedOut && !e.g.json {
		fmt.Fprintf(e.io.err, "runner: %s: terminated after --max-time %s\n", what, *f.maxTime)
	}
	if e.g.json && r.frame.Kind != wire.FrameError {
		x, err := r.frame.Exit()
		if err == nil {
			if r.frame.Kind == wire.FrameLost {
				x.Reason = wire.ExitLost
			}
			if err := e.printJSON(execJSON{Session: s.ID, StdoutBase64: nonNil(outBuf.Bytes()), StderrBase64: nonNil(errBuf.Bytes()),
				TimedOut: r.timedOut, Exit: x}); err != nil {
				return err
			}
		}
	}
	return e.endOf(ctx, c, what, name, r.frame)
}

// execStart starts req as a session in sandbox name, retrying while
// runnerd is unavailable (a retry of the same id never starts a second
// process), and reports whether the session is this runner's to end
// (owned: generated says runner made up its id).
func (e *env) execStart(ctx context.Context, c *client.Client, what, name string, req wire.CreateSession, generated bool) (s wire.Session, owned bool, err error) {
	// Ask runnerd once before the spawn: rejoining after a cut
	// connection is only for a daemon that was there (a runnerd that
	// never answered is reported at once, not waited for).
	hctx, hcancel := e.callCtx(ctx)
	_, herr := c.Health(hctx)
	hcancel()
	if herr != nil {
		return s, false, &cliError{what: what, err: herr}
	}
	owned = generated
	attempts, created := 0, false
	err = retryUnavailable(ctx, e, req.ID, func(cctx context.Context) error {
		var err error
		attempts++
		s, created, err = c.CreateSession(cctx, name, req)
		owned = owned || created
		return err
	})
	if err == nil && !created && attempts == 1 {
		// --id named a session that was there before this call (not a
		// retry of ours): the same request is answered with it, and
		// nothing runs again. Say so rather than pass it off as a run.
		execExistingNote(e, name, s)
	}
	if err == nil {
		return s, owned, nil
	}
	if xe := startFailure(err, what, name, req.Argv[0]); xe != nil {
		return s, owned, xe
	}
	ce := &cliError{what: what, err: err}
	switch _, kind := codeOf(err); kind {
	case "unavailable":
		ce.hint = hints(hintFor(err, e.where), fmt.Sprintf(
			"if runnerd got the request, the outcome is unknown and the command may still run as session %s: runner sessions %s %s", req.ID, name, req.ID))
	case "not_found":
		ce.hint = noSandboxHint
	case "invalid":
		ce.hint = e.spawnConflictHint(ctx, c, err, name, req)
	}
	return s, owned, ce
}

func init() {
	commands = append(commands,
		&command{name: "exec", args: "NAME [-i] [-t] [flags] [--] COMMAND [ARG...]", min: 1, max: 1, argvAfter: 1,
			short: "run a command, print its output as it writes it, exit with its code",
			long: `The command runs as a session of its own (listed by runner sessions, its output
journaled); runner follows it live, stdout to stdout and stderr to stderr, and
exits with its code (128+N when signal N killed it). There is no size cut.
runner sends no local environment: pass --env. --env KEY=VALUE puts VALUE in
runner's argv, which every process that runs ps can read (sandboxes too: they
share the host's process list); --env KEY (the value from runner's own
environment, as docker run -e KEY) and --env-file FILE keep it out of argv.
Order: when runner's stdout and stderr are one file (a terminal, or 2>&1), the
command gets one pipe for both, so its output shows in the order it wrote it
(the session's stderr stream is then empty). When they are apart, each stream
keeps its own order and the two interleave as runnerd journaled them, which
may differ from the order the command wrote them.
-i streams runner's stdin to the command as it is typed or read; EOF closes the
command's stdin. Without -i the command's stdin is at EOF from the start.
-t runs the command on a terminal (one output stream); -it makes this terminal
the command's (raw mode, size followed, Ctrl-] detaches), as docker exec -it.
Ctrl-C sends SIGINT to the command and keeps waiting; a second Ctrl-C stops
waiting (exit 130) and leaves the command running.
When whoever reads runner's output goes away (runner exec web-1 -- yes | head -1),
the command ends as it would have in the pipeline: runner sends it SIGPIPE, then
terminates it (SIGTERM, SIGKILL 1 s later) if it still runs 50 ms later, waits
for its end, and exits 141 (128+SIGPIPE).
If the connection to runnerd is lost (runnerd restarts), runner rejoins the
same session from where its output was, for up to 30 s, and still exits with
the command's code; every byte is printed once, and input read meanwhile (-i)
is kept (1 MiB, then runner stops reading) and sent once runnerd is back. If runnerd stays away the
outcome is unknown: runner says so and exits 255 (never 0), naming the session.
A command that does not exist exits 127, one that cannot be run 126, as in sh.
--max-time is kept by runner: the command is terminated when it passes.
--json prints one object once the command ends: {"session", "stdout_base64",
"stderr_base64", "stdout_truncated", "stderr_truncated", "timed_out", "exit"}
(docs/cli.md); the *_truncated flags are always false.
Examples:
  runner exec web-1 -- sh -c 'echo hi; exit 3'; echo $?      # hi, 3
  API_KEY=$(cat key) runner exec web-1 --env API_KEY -- ./deploy   # the key stays out of ps
  tar c src | runner exec web-1 -i -- tar x                  # -i: send local stdin
  runner exec -it web-1 -- bash                              # a shell, as docker exec -it`,
			setup: execCmd},
		&command{name: "run", args: "NAME [-i] [-t] [--id ID] [flags] [--] COMMAND [ARG...]", min: 1, max: 1, argvAfter: 1,
			short: "create the sandbox if missing, then run a command in it and attach (-it on a terminal)",
			long: `run is create NAME (idempotent) followed by exec. On a terminal it is exec -it:
this terminal becomes the command's; elsewhere -i (stdin streamed). -t=false or
-i=false turn either off.
With --id, run is tmux's new -A: the first run starts session ID; a run with the
same id and command while it runs attaches to it instead of starting another
(its output is replayed from the start), whatever its terminal or environment
(a spawn --tty shell too); once it has ended, run says so, removes it (its output
with it) and starts the command again. The same id while another command runs
is refused, naming what differs.
Examples:
  runner run dev -- bash
  runner run dev --id shell -- bash     # again later: back in the same shell`,
			setup: runCmd},
	)
}
