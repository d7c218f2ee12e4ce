// Command runner-shim runs commands as detached, journaled sessions and
// drives them from a shell: the standalone form of package shim, for
// sandboxes whose only interface is a plain exec API. Each subcommand
// parses its flags and makes one call into package shim; answer.go turns
// the result into the human or --json answer and the exit status.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// usageText is the help; its %[1]d and %[2]d are attach --text's lost and
// error statuses, which wire names.
const usageText = `runner-shim: run commands as detached, journaled sessions.

Usage: runner-shim [--root DIR] [--json] COMMAND [flags] [args]
       runner-shim --version | version

Sessions live in DIR/ID (default root: $RUNNER_SHIM_ROOT, else
/var/lib/runner-shim for root, else $XDG_STATE_HOME/runner-shim or
~/.local/state/runner-shim). Keep DIR short: the control socket path
DIR/ID/ctl.sock must fit in 107 bytes.

--json (before or after COMMAND) makes every answer one JSON object on one
line of stdout, carrying "version"; a failure is
{"version":V,"error":{"code":CODE,"detail":TEXT}} with a code of the
contract (not_found, invalid, command_exited, lost, unavailable, ...).
See docs/frames.md, "runner-shim's command line", for every shape.

Commands:
  spawn [--id ID] [--tty] [--rows N] [--cols N] [--cwd DIR] [--user U]
        [--env K=V]... [--clear-env] [--stdin-closed] [--netns PATH]
        [--retain BYTES] [--prune AGE] -- ARGV...
      Start ARGV (no shell) as a detached session. Answers (the session id,
      or with --json the session) only once the command runs; a command
      that cannot start is an error and leaves nothing behind. The same
      --id again with the same request answers the existing session
      ("created":false); with another request it is a conflict. The
      environment is runner-shim's own unless --clear-env, plus each --env.
      --prune first removes the root's sessions that ended more than AGE
      ago and whose shims are gone (for a root of one-shot execs).
  attach [--stdout N] [--stderr M] [--text | --base64] [--heartbeat DUR]
         [--lease DUR] [--max-bytes N] [--ack] ID
      Replay the session from the cursors (default 0) and follow it live.
      Writes the binary frame stream of docs/frames.md to stdout, ending
      with exactly one terminal frame (exit, lost or error). --base64
      writes each frame as one base64 line instead (text-safe). --lease and
      --max-bytes bound the attach: reaching either before the end, it ends
      with an unavailable error frame whose detail is "lease ended:
      stdout=N stderr=M", the cursors to attach again from. --ack emits a
      heartbeat first, once the streams are open. --text writes
      raw stdout/stderr bytes and exits with the command's status
      (128+signal if killed, %[1]d if lost, %[2]d on an error frame).
  write [--base64] ID [DATA...]
      Write DATA (the arguments joined by spaces, no newline added) to the
      command's stdin, or, with no DATA, copy runner-shim's own stdin.
      --base64: DATA is base64, or each line of stdin is.
  close-stdin ID
      Send a real end of file (TTY: the terminal's ^D at a line start).
  signal ID SIG
      Send SIG (a name like TERM or SIGTERM, or a number) to the process group.
  resize ID ROWS COLS
      Set a TTY session's terminal size.
  terminate [--grace DUR] ID
      SIGTERM the process group, SIGKILL after the grace (default 10s);
      print the exit record as JSON once it is in the journal.
  status ID
      Print the session (state, argv, byte counts, exit record) as JSON.
  list [--max-bytes N] [--after ID]
      Print every session in start order, one JSON object per line
      (--json: one object {"sessions":[...]}); --max-bytes ends a page
      early with "more": true, --after ID continues after that session.
  version
      Print runner-shim's version.
  serve MODE ARGS...
      Internal: the shim process itself (what spawn starts); MODE is a row
      of the supervisor's table, e.g. session [--detach] [--ready-fd N] DIR.

Exit status (wire.ShimExit*): 0 success (attach: the stream ended with an
exit or lost frame, or its lease), 1 failure, 2 usage, 3 the command has
exited (write, close-stdin, signal, resize after the end), 4 the session
is lost, 5 no such session, 6 invalid request or cursor, 7 the id exists
with another request, 8 unavailable (retry), 9 cursor behind the retained
output, 126 spawn: the program cannot be executed, 127 spawn: no such
program (or working directory).
`

var usage = fmt.Sprintf(usageText, wire.ShimTextExitLost, wire.ShimTextExitError)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		os.Exit(shim.Main(os.Args[2:], hooks))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	top := flag.NewFlagSet("runner-shim", flag.ContinueOnError)
	top.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	root := top.String("root", sessiondir.DefaultRoot(), "session root directory")
	jsonOut := top.Bool("json", false, "answer with one JSON object per answer")
	showVersion := top.Bool("version", false, "print the version and exit")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return wire.ShimExitOK
		}
		return wire.ShimExitUsage
	}
	a := &answerer{json: jsonOut}
	if *showVersion {
		return a.version()
	}
	if top.NArg() == 0 {
		top.Usage()
		return wire.ShimExitUsage
	}
	cmd, args := top.Arg(0), top.Args()[1:]
	a.cmd = cmd
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	fs.BoolVar(jsonOut, "json", *jsonOut, "answer with one JSON object per answer")
	dirOf := func(id string) string { return filepath.Join(*root, id) }
	// pos parses flags and wants at least n positional arguments, the
	// first a session id (but for spawn: the command's argv).
	pos := func(n int) ([]string, bool) {
		if err := fs.Parse(args); err != nil {
			return nil, false
		}
		if fs.NArg() < n || (n > 0 && cmd != "spawn" && !sessiondir.ValidID(fs.Arg(0))) {
			a.usage(fmt.Sprintf("want %d argument(s), the first a session id", n))
			return nil, false
		}
		return fs.Args(), true
	}

	switch cmd {
	case "version":
		if _, ok := pos(0); !ok {
			return wire.ShimExitUsage
		}
		return a.version()

	case "spawn":
		id := fs.String("id", "", "session id (default: random)")
		tty := fs.Bool("tty", false, "run under a pseudo-terminal")
		rows := fs.Uint("rows", 24, "initial terminal rows")
		cols := fs.Uint("cols", 80, "initial terminal columns")
		cwd := fs.String("cwd", "", "working directory")
		user := fs.String("user", "", "run as user (name or uid[:gid])")
		netns := fs.String("netns", "", "network namespace file to run in")
		retain := fs.Int64("retain", 0, "bytes to retain per stream (0: all)")
		clearEnv := fs.Bool("clear-env", false, "start from an empty environment")
		stdinClosed := fs.Bool("stdin-closed", false, "start the command with its stdin at end of file")
		holdTask := fs.String("hold-task", "", "Sprites Tasks API socket to hold a task on while the command runs (off when empty)")
		prune := fs.Duration("prune", 0, "first remove sessions of the root that ended longer ago than this, their shims gone (0: none)")
		var env multi
		fs.Var(&env, "env", "K=V added to the environment (repeatable)")
		argv, ok := pos(1)
		if !ok {
			return wire.ShimExitUsage
		}
		if *id == "" {
			*id = randomID()
		}
		spec := sessiondir.Spec{ID: *id, Argv: argv, Dir: *cwd, User: *user, TTY: *tty,
			Rows: uint16(*rows), Cols: uint16(*cols), NetNS: *netns, RetainBytes: *retain, StdinClosed: *stdinClosed}
		if *holdTask != "" {
			// Resolved here: the session's shim does not run in this
			// call's working directory.
			abs, err := filepath.Abs(*holdTask)
			if err != nil {
				return a.fail(err)
			}
			spec.HoldTask = abs
		}
		if !*clearEnv {
			spec.Env = os.Environ()
		}
		spec.Env = append(spec.Env, env...)
		exe, err := os.Executable()
		if err != nil {
			return a.fail(err)
		}
		if *prune > 0 {
			// Best effort: a root of one-shot sessions (a driver's execs)
			// stays bounded without a round trip of its own.
			if err := sessiondir.Prune(*root, *prune, time.Now()); err != nil {
				fmt.Fprintf(os.Stderr, "runner-shim spawn: prune: %v\n", err)
			}
		}
		in, created, err := spawn(ctx, []string{exe, "serve"}, dirOf(*id), spec)
		if err != nil {
			return a.fail(err)
		}
		return a.ok(in.ID+"\n", reply{ID: in.ID, Created: &created, Session: &in})

	case "attach":
		so := fs.Int64("stdout", 0, "stdout cursor")
		se := fs.Int64("stderr", 0, "stderr cursor")
		text := fs.Bool("text", false, "write raw bytes to stdout/stderr and exit with the command's status")
		b64 := fs.Bool("base64", false, "write each frame as one base64 line")
		hb := fs.Duration("heartbeat", sessiondir.DefaultHeartbeat, "heartbeat after this much silence (frames mode)")
		lease := fs.Duration("lease", 0, "end after this long with a resumable cursor (0: follow to the end)")
		maxBytes := fs.Int64("max-bytes", 0, "end after about this many data bytes with a resumable cursor (0: no bound)")
		ack := fs.Bool("ack", false, "emit a heartbeat as soon as the streams are open at the cursors")
		p, ok := pos(1)
		if !ok {
			return wire.ShimExitUsage
		}
		if *text && *b64 {
			a.usage("--text and --base64 exclude each other")
			return wire.ShimExitUsage
		}
		if *lease < 0 || *maxBytes < 0 {
			a.usage("--lease and --max-bytes are not negative")
			return wire.ShimExitUsage
		}
		opts := sessiondir.AttachOptions{Stdout: *so, Stderr: *se, Heartbeat: *hb, Lease: *lease, MaxBytes: *maxBytes, Ack: *ack}
		if *text {
			status, err := sessiondir.AttachText(ctx, dirOf(p[0]), opts, os.Stdout, os.Stderr)
			if err != nil {
				return a.fail(err)
			}
			return status
		}
		emit := writeAll
		if *b64 {
			emit = sessiondir.Base64Writer(os.Stdout)
		}
		var end wire.Frame
		err := sessiondir.Attach(ctx, dirOf(p[0]), opts, func(b []byte) error {
			if len(b) > 2 && wire.FrameKind(b[2]).Terminal() {
				f, err := wire.ParseFrame(b)
				if err != nil {
					return err
				}
				end = f
				end.Payload = append([]byte(nil), f.Payload...)
			}
			return emit(b)
		})
		if err != nil {
			// The stream was cut (stdout closed, interrupted): no answer.
			fmt.Fprintf(os.Stderr, "runner-shim attach: %v\n", err)
			return wire.ShimExitUnavailable
		}
		return attachStatus(end)

	case "write", "close-stdin", "signal", "resize", "terminate", "status":
		grace := fs.Duration("grace", 10*time.Second, "terminate: time between SIGTERM and SIGKILL")
		b64 := fs.Bool("base64", false, "write: DATA or each stdin line is base64")
		want := map[string]int{"write": 1, "close-stdin": 1, "signal": 2, "resize": 3, "terminate": 1, "status": 1}[cmd]
		p, ok := pos(want)
		if !ok {
			return wire.ShimExitUsage
		}
		id := p[0]
		if cmd == "status" {
			in, err := launch.Inspect(ctx, dirOf(id))
			if err != nil {
				return a.fail(err)
			}
			return a.ok(indent(in), reply{Session: &in})
		}
		// Parse everything before touching the session.
		var data []byte
		var sig syscall.Signal
		var rows, cols uint64
		switch cmd {
		case "write":
			if len(p) > 1 {
				data = []byte(strings.Join(p[1:], " "))
				if *b64 {
					d, err := base64.StdEncoding.DecodeString(strings.Join(p[1:], ""))
					if err != nil {
						return a.fail(fmt.Errorf("%w: decode data: %v", sessiondir.ErrInvalid, err))
					}
					data = d
				}
			}
		case "signal":
			n, err := wire.ParseSignal(p[1])
			if err != nil {
				return a.fail(fmt.Errorf("%w: %v", sessiondir.ErrInvalid, err))
			}
			sig = syscall.Signal(n)
		case "resize":
			var err1, err2 error
			rows, err1 = strconv.ParseUint(p[1], 10, 16)
			cols, err2 = strconv.ParseUint(p[2], 10, 16)
			if err1 != nil || err2 != nil || rows == 0 || cols == 0 {
				return a.fail(fmt.Errorf("%w: rows and cols are numbers 1-65535", sessiondir.ErrInvalid))
			}
		}
		c, err := launch.Dial(ctx, dirOf(id))
		if err != nil {
			return a.fail(err)
		}
		defer c.Close()
		ans := reply{ID: id, OK: true}
		switch cmd {
		case "write":
			switch {
			case len(p) > 1:
				err = c.WriteStdin(ctx, data)
				ans.Written = ptr(len(data))
			case *b64:
				err = launch.CopyStdinBase64(ctx, c, os.Stdin)
			default:
				err = launch.CopyStdin(ctx, c, os.Stdin)
			}
		case "close-stdin":
			err = c.CloseStdin(ctx)
		case "signal":
			err = c.Signal(ctx, sig)
		case "resize":
			err = c.Resize(ctx, uint16(rows), uint16(cols))
		case "terminate":
			e, terr := c.Terminate(ctx, *grace)
			if terr == nil {
				return a.ok(indent(e), reply{ID: id, Exit: ptr(sessiondir.WireExit(e))})
			}
			err = terr
		}
		if err != nil {
			return a.fail(err)
		}
		return a.ok("", ans)

	case "list":
		after := fs.String("after", "", "list only the sessions started after this one (a page's last id)")
		maxBytes := fs.Int("max-bytes", 0, "end the page (\"more\": true) before its sessions' JSON passes this many bytes; at least one session (0: no bound)")
		if _, ok := pos(0); !ok {
			return wire.ShimExitUsage
		}
		list, err := sessiondir.ListInfo(*root)
		if err != nil {
			return a.fail(err)
		}
		list, more, err := listPage(list, *after, *maxBytes)
		if err != nil {
			return a.fail(err)
		}
		var lines strings.Builder
		for _, in := range list {
			lines.WriteString(compact(in))
		}
		// Paged (More) so that one answer fits where a transport caps
		// output (Sprites replays a fast exec's output capped at 64 KiB).
		return a.ok(lines.String(), reply{Sessions: list, More: more})

	case "help", "-h", "--help":
		fmt.Print(usage)
		return wire.ShimExitOK
	}
	a.usage(fmt.Sprintf("unknown command %q", cmd))
	return wire.ShimExitUsage
}

// listPage returns the sessions after the one named after (all when
// empty; an unknown one is invalid, never an empty page) up to about
// maxBytes of JSON (0: no bound), at least one, and whether more follow.
func listPage(list []sessiondir.Info, after string, maxBytes int) ([]sessiondir.Info, bool, error) {
	if after != "" {
		i := slices.IndexFunc(list, func(in sessiondir.Info) bool { return in.ID == after })
		if i < 0 {
			return nil, false, fmt.Errorf("%w: --after %q is not a session of this root", sessiondir.ErrInvalid, after)
		}
		list = list[i+1:]
	}
	if maxBytes <= 0 {
		return list, false, nil
	}
	size := 0
	for i, in := range list {
		b, _ := json.Marshal(in)
		size += len(b) + 1
		if size > maxBytes && i > 0 {
			return list[:i], true, nil
		}
	}
	return list, false, nil
}

// errConflict is spawn --id of an existing session with another request.
var errConflict = errors.New("exists with a different request")

// spawn starts spec in dir, or answers the session already there when it
// was started with the same request (a retried spawn: created is false),
// as runnerd does. A session with the id and another request is
// errConflict. A concurrent spawn of the same id that is still starting
// is waited for; one that failed (and removed its files) is retried.
func spawn(ctx context.Context, exe []string, dir string, spec sessiondir.Spec) (in sessiondir.Info, created bool, err error) {
	shims := launch.NewPool(exe, launch.PoolOptions{}) // no warm shims in a guest: every start is cold
	defer shims.Close()
	for {
		st, err := shims.Start(ctx, dir, spec)
		if err == nil {
			in, err := sessiondir.Describe(dir, st)
			return in, true, err
		}
		if !errors.Is(err, sessiondir.ErrExists) {
			return sessiondir.Info{}, false, err
		}
		have, err := sessiondir.ReadSpec(dir)
		if errors.Is(err, sessiondir.ErrNoSession) {
			continue // the other start failed and cleaned up: try ours
		}
		if err != nil {
			return sessiondir.Info{}, false, err
		}
		if !sessiondir.SameRequest(have, spec) {
			return sessiondir.Info{}, false, fmt.Errorf("session %s: %w", spec.ID, errConflict)
		}
		// Started (or starting, by a concurrent spawn): answer it once it
		// runs, as that spawn will.
		for {
			st, err := sessiondir.ReadStatus(dir)
			if err == nil {
				in, err := sessiondir.Describe(dir, st)
				return in, false, err
			}
			if !errors.Is(err, sessiondir.ErrNoSession) {
				return sessiondir.Info{}, false, err
			}
			if _, serr := sessiondir.ReadSpec(dir); errors.Is(serr, sessiondir.ErrNoSession) {
				break // its start failed: start again
			}
			select {
			case <-ctx.Done():
				return sessiondir.Info{}, false, fmt.Errorf("%w: wait for session %s to start: %w", sessiondir.ErrUnavailable, spec.ID, ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// attachStatus is attach's exit status for the terminal frame it wrote:
// success for an exit, a lost session (the stream said so) or a lease's
// end; the code's status for an error frame; unavailable when none came.
func attachStatus(end wire.Frame) int {
	switch end.Kind {
	case wire.FrameExit, wire.FrameLost:
		return wire.ShimExitOK
	case wire.FrameError:
		we, err := end.Err()
		if err != nil {
			return wire.ShimExitFailure
		}
		if IsLeaseEnd(we) {
			return wire.ShimExitOK
		}
		if row, ok := wire.RowOf(we.Code); ok {
			return row.ShimExit
		}
		return wire.ShimExitFailure
	}
	return wire.ShimExitUnavailable
}

// IsLeaseEnd reports whether we is a bounded attach's end.
func IsLeaseEnd(we *wire.Error) bool {
	return we.Code == wire.CodeUnavailable && strings.HasPrefix(we.Detail, wire.ShimDetailLeaseEnded+":")
}

func writeAll(b []byte) error {
	_, err := os.Stdout.Write(b)
	return err
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// isExecErr reports the shell's status for a start failure of the
// command's own program: 127 when it (or the working directory) does not
// exist, 126 when it cannot be executed.
func execStatus(err error) (int, bool) {
	var se *launch.StartError
	if !errors.As(err, &se) || se.Phase != launch.PhaseExec {
		return 0, false
	}
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		return wire.ShimExitExecNotFound, true
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ELIBBAD), errors.Is(err, syscall.E2BIG):
		return wire.ShimExitExecNotExecutable, true
	}
	return wire.ShimExitInvalid, true
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func ptr[T any](v T) *T { return &v }
