package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands,
		&command{name: "exec", args: "NAME [flags] [--] COMMAND [ARG...]", min: 1, max: 1, argvAfter: 1,
			short: "run a command to completion; print its stdout and stderr; exit with its code",
			long: `The command runs as a session of its own (listed by runner sessions, its output
journaled). runner waits for its exit and exits with the same code (128+N when
signal N killed it). runner sends no local environment: pass --env.
Ctrl-C sends SIGINT to the command and keeps waiting; a second Ctrl-C stops
waiting (exit 130) and leaves the command running.
If the connection to runnerd is lost (runnerd restarts), runner rejoins the
same session, as attach reconnects, for up to 30 s, and still exits with the
command's code; the output is printed once. If runnerd stays away the outcome is
unknown: runner says so and exits 255 (never 0), naming the session to look at.
A command that does not exist exits 127, one that cannot be run 126, as in sh.
--json prints one object: {"session", "stdout_base64", "stderr_base64",
"stdout_truncated", "stderr_truncated", "timed_out", "exit"} (docs/cli.md).
Examples:
  runner exec web-1 -- sh -c 'echo hi; exit 3'; echo $?      # hi, 3
  tar c src | runner exec web-1 -i -- tar x                  # -i: send local stdin`,
			setup: execCmd},
		&command{name: "spawn", args: "NAME [--tty] [--id ID] [flags] [--] COMMAND [ARG...]", min: 1, max: 1, argvAfter: 1,
			short: "start a long-running session; print its id once the command runs",
			long: `The session lives until its command ends, whatever happens to runner or to
attached clients. With --tty it runs on a terminal (one output stream); attach to
it with runner attach. --id makes a retry safe: the same id and request never
start a second process.
Examples:
  runner spawn web-1 --tty -- bash
  id=$(runner spawn web-1 -- make test) && runner logs web-1 "$id" -f`,
			setup: spawnCmd},
		&command{name: "sessions", args: "NAME [ID]", min: 1, max: 2,
			short: "list a sandbox's sessions (running and ended), or show one",
			long: `Sessions are listed by start time, oldest first. --json prints an array of
session objects (or one object with ID); [] when there are none.`,
			setup: sessionsCmd},
		&command{name: "write", args: "NAME ID [DATA|-]", min: 2, max: 3,
			short: "write to a session's stdin (DATA plus a newline, or stdin with -)",
			long: `DATA is written followed by a newline, like echo; -n leaves the newline out.
With - (or no DATA) runner copies its own stdin, exactly, until EOF (it does not
close the session's stdin: use close-stdin for that).
Examples:
  runner write web-1 s1 'print(1+1)'
  printf 'raw bytes' | runner write web-1 s1 -`,
			setup: writeCmd},
		&command{name: "close-stdin", args: "NAME ID", min: 2, max: 2,
			short: "close a session's stdin: the command reads EOF (^D on a terminal)",
			setup: simpleSessionCmd("close-stdin")},
		&command{name: "signal", args: "NAME ID SIGNAL", min: 3, max: 3,
			short: "send a signal (TERM, INT, KILL, HUP, 9, ...) to the session's process group",
			setup: simpleSessionCmd("signal")},
		&command{name: "terminate", args: "NAME ID [--grace 10s]", min: 2, max: 2,
			short: "stop a session: SIGTERM, SIGKILL after the grace; print how it ended",
			long: `Answers once the exit is recorded. runner exits 0 when the session is known to
have ended (whatever its code); if runnerd cannot confirm the end it is
unavailable (255) and the session may still run: terminate again.`,
			setup: terminateCmd},
		&command{name: "logs", args: "NAME ID [--stream stdout|stderr] [--cursor N | --tail N] [-f]", min: 2, max: 2,
			short: "print a session's output from a byte cursor; -f follows until it ends",
			long: `Output is replayed byte-exactly from the journal, live or long after the command
ended. A cursor is a byte offset in the stream: resume with --cursor at the
number of bytes you already have; --tail N starts N bytes before the end (a
terminal stream may then start in the middle of an escape sequence or a UTF-8
character). A TTY session has only stdout.
Without -f runner prints what exists now and exits 0. With -f it prints until
the session ends. A session that ended without an exit record (lost) exits 254;
a cut connection exits 255 and says the cursor to resume from.`,
			setup: logsCmd},
		&command{name: "rm-session", args: "NAME ID...", min: 2, max: -1,
			short: "delete ended sessions: their journals and records",
			long: `Only a session that has ended (and left no process behind) can be deleted;
a running one is refused (terminate it first). Deleting a session that does not
exist succeeds. Its output cannot be replayed afterwards: save what you need.
--json prints {"sandbox": NAME, "removed": [ID...]}.`,
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				return func(ctx context.Context, e *env, pos, _ []string) error {
					c, err := e.client()
					if err != nil {
						return err
					}
					out := removedSessions{Sandbox: pos[0], Removed: []string{}}
					for _, id := range pos[1:] {
						cctx, cancel := e.callCtx(ctx) // not below the client's own bound (--timeout plus the delete's wait)
						err := c.DeleteSession(cctx, pos[0], id)
						cancel()
						if err != nil {
							if e.g.json && len(out.Removed) > 0 {
								_ = e.printJSON(out) // what was removed before the failure
							}
							return fail("rm-session "+pos[0]+" "+id, err)
						}
						if !e.g.json {
							fmt.Fprintf(e.io.out, "removed session %s\n", id)
						}
						out.Removed = append(out.Removed, id)
					}
					if e.g.json {
						return e.printJSON(out)
					}
					return nil
				}
			}},
	)
}

// removedSessions is what rm-session --json prints.
type removedSessions struct {
	Sandbox string   `json:"sandbox"`
	Removed []string `json:"removed"`
}

const noSandboxHint = "`runner ls` lists the sandboxes; `runner create NAME` makes one"

// newID returns a session id for exec, so that runner can name the session
// if the answer never arrives.
func newID(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// exitOf turns an exit record into runner's exit code and, for anything but
// a plain exit, a message.
func exitOf(what string, e wire.Exit) (int, string) {
	switch e.Reason {
	case wire.ExitExited:
		return e.Code, ""
	case wire.ExitSignaled:
		code := e.Code
		if code == 0 {
			code = 128 + e.Signal
		}
		return code, fmt.Sprintf("runner: %s: killed by signal %d (%s), exit code %d", what, e.Signal, client.SignalName(e.Signal), code)
	}
	msg := fmt.Sprintf("runner: %s: lost: the session ended without an exit record; its exit code is unknown", what)
	if e.Detail != "" {
		msg += " (" + oneLine(e.Detail) + ")"
	}
	return exitLost, msg
}

// exitErrorOf is the error that ends runner for an exit record: nil for a
// success, the command's own status, or lost.
func exitErrorOf(what string, x wire.Exit) error {
	code, msg := exitOf(what, x)
	switch {
	case code == 0 && msg == "":
		return nil
	case x.Reason != wire.ExitExited && x.Reason != wire.ExitSignaled:
		return &exitError{code: code, msg: msg, kind: "lost", what: what}
	}
	return &exitError{code: code, msg: msg}
}

// startFailure is the error for a spawn or exec whose command could not
// be started because it does not exist (127) or cannot be run (126), as
// a shell reports them; nil for any other error.
func startFailure(err error, what, sandbox, argv0 string) error {
	var api *client.APIError
	if !errors.As(err, &api) || api.Code != wire.CodeInvalid {
		return nil
	}
	var code int
	var detail string
	switch api.ExecError {
	case wire.ExecErrorNotFound:
		code, detail = exitCmdNotFound, fmt.Sprintf("%s: command not found in sandbox %s", argv0, sandbox)
	case wire.ExecErrorNotExecutable:
		code, detail = exitNotExecutable, fmt.Sprintf("%s: command not executable in sandbox %s", argv0, sandbox)
	default:
		return nil
	}
	return &exitError{code: code, msg: "runner: " + detail, kind: string(wire.CodeInvalid),
		what: what, detail: detail, execError: api.ExecError}
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

func execJSONOf(r wire.ExecResult) execJSON {
	return execJSON{Session: r.Session, StdoutBase64: nonNil(r.Stdout), StderrBase64: nonNil(r.Stderr),
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, TimedOut: r.TimedOut, Exit: r.Exit}
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// execRejoin runs req and, when the connection to runnerd is lost before
// the answer (runnerd restarted, or the connection was cut), sends it
// again with the same session id for up to reconnectFor: runnerd then
// rejoins the running session (a retried id never starts a second
// process, and stdin is not sent twice) and answers its whole output and
// exit once it ends, so every byte is printed once. A --max-time keeps
// its original deadline.
func execRejoin(ctx context.Context, e *env, c *client.Client, name string, req wire.Exec) (wire.ExecResult, error) {
	start := time.Now()
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	var lostAt time.Time
	backoff := 250 * time.Millisecond
	for {
		if timeout > 0 {
			req.TimeoutMS = int(max((timeout-time.Since(start))/time.Millisecond, 1))
		}
		r, err := c.Exec(ctx, name, req)
		if err == nil || ctx.Err() != nil || !errors.Is(err, adapter.ErrUnavailable) {
			return r, err
		}
		if lostAt.IsZero() {
			lostAt = time.Now()
			msg := fmt.Sprintf("connection to runnerd lost; rejoining session %s (the command keeps running)...", req.ID)
			if e.g.json {
				writeJSONWarning(e, msg)
			} else {
				fmt.Fprintf(e.io.err, "runner: %s\n", msg)
			}
		} else if time.Since(lostAt) > reconnectFor {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, err
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func execCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	var envs stringList
	fs.Var(&envs, "env", "set KEY=VALUE in the command's environment (repeatable)")
	cwd := fs.String("cwd", "", "working directory, relative to the workspace")
	id := fs.String("id", "", "session id (default: exec-<random>); a retry with the same id never runs twice")
	stdin := fs.Bool("i", false, "send runner's own stdin (read to EOF) as the command's stdin")
	maxTime := fs.Duration("max-time", 0, "terminate the command after this long (0: no limit)")
	return func(ctx context.Context, e *env, pos, argv []string) error {
		name := pos[0]
		c, err := e.client()
		if err != nil {
			return err
		}
		req := wire.Exec{ID: *id, Argv: argv, Env: envs, Cwd: *cwd}
		if req.ID == "" {
			req.ID = newID("exec-")
		}
		if *maxTime > 0 {
			req.TimeoutMS = int(max(*maxTime/time.Millisecond, 1))
		}
		if *stdin {
			b, err := io.ReadAll(io.LimitReader(e.io.in, wire.MaxStdinBody+1))
			if err != nil {
				return &exitError{code: exitUsage, kind: "usage", msg: fmt.Sprintf("runner: exec: read stdin: %v", err)}
			}
			if len(b) > wire.MaxStdinBody {
				return usagef("exec", "-i: stdin is larger than %d bytes; use spawn and write instead", wire.MaxStdinBody)
			}
			req.Stdin = b
			// runnerd reads an exec request as one JSON body of at most
			// wire.MaxJSONBody bytes, stdin in base64 (about 768 KiB of
			// it): refuse here, as the usage mistake it is, rather than
			// send a request runnerd must refuse.
			if body, err := json.Marshal(req); err == nil && len(body) > wire.MaxJSONBody {
				return usagef("exec", "-i: %d bytes of stdin do not fit in one exec request (%d bytes of JSON, stdin in base64: about %d KiB of stdin at most); use spawn and write instead",
					len(b), wire.MaxJSONBody, wire.MaxJSONBody*3/4>>10)
			}
		}
		what := "exec " + name
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(sigs)

		// Ask runnerd once before the exec: rejoining after a cut
		// connection is only for a daemon that was there (a runnerd that
		// never answered is reported at once, not waited for).
		hctx, hcancel := e.callCtx(ctx)
		_, herr := c.Health(hctx)
		hcancel()
		if herr != nil {
			ce := &cliError{what: what, err: herr}
			if _, kind := codeOf(herr); kind == "unavailable" {
				ce.hint = hintFor(kind, e.where)
			}
			return ce
		}

		ectx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			r   wire.ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := execRejoin(ectx, e, c, name, req)
			done <- result{r, err}
		}()
		interrupts := 0
		var res result
	wait:
		for {
			select {
			case res = <-done:
				break wait
			case s := <-sigs:
				interrupts++
				if interrupts > 1 {
					cancel()
					<-done
					return &exitError{code: exitInterrupted, kind: "interrupted", what: what, msg: fmt.Sprintf(
						"runner: %s: stopped waiting; the command may still run\nrunner: hint: runner logs %s %s -f   |   runner terminate %s %s",
						what, name, req.ID, name, req.ID)}
				}
				sig := "INT"
				if s == syscall.SIGTERM {
					sig = "TERM"
				}
				sctx, scancel := e.callCtx(ctx)
				err := c.Signal(sctx, name, req.ID, sig)
				scancel()
				if err != nil {
					fmt.Fprintf(e.io.err, "runner: %s: could not forward SIG%s: %s\n", what, sig, oneLine(detailOf(err)))
				}
				fmt.Fprintf(e.io.err, "runner: sent SIG%s to %s; Ctrl-C again to stop waiting (the command keeps running)\n", sig, req.ID)
			}
		}
		if res.err != nil {
			if xe := startFailure(res.err, what, name, argv[0]); xe != nil {
				return xe
			}
			ce := &cliError{what: what, err: res.err}
			switch _, kind := codeOf(res.err); kind {
			case "unavailable":
				ce.hint = hintFor(kind, e.where) + "\n" + fmt.Sprintf(
					"if runnerd got the request, the outcome is unknown and the command may still run as session %s: runner sessions %s %s", req.ID, name, req.ID)
			case "not_found":
				ce.hint = noSandboxHint
			}
			return ce
		}
		r := res.r
		if e.g.json {
			if err := e.printJSON(execJSONOf(r)); err != nil {
				return err
			}
		} else {
			if _, err := e.io.out.Write(r.Stdout); err != nil {
				return err
			}
			if _, err := e.io.err.Write(r.Stderr); err != nil {
				return err
			}
		}
		// In --json mode the object says all this (stdout_truncated,
		// stderr_truncated, timed_out, exit) and stderr stays JSON-only.
		for _, t := range []struct {
			trunc  bool
			stream string
		}{{r.StdoutTruncated, "stdout"}, {r.StderrTruncated, "stderr"}} {
			if t.trunc && !e.g.json {
				fmt.Fprintf(e.io.err, "runner: %s: %s was cut at %d MiB; the rest: runner logs %s %s --stream %s --cursor %d\n",
					what, t.stream, wire.MaxExecOutput>>20, name, r.Session, t.stream, wire.MaxExecOutput)
			}
		}
		if r.TimedOut && !e.g.json {
			fmt.Fprintf(e.io.err, "runner: %s: terminated after --max-time %s\n", what, *maxTime)
		}
		return exitErrorOf(what, r.Exit)
	}
}

func spawnCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	var envs stringList
	fs.Var(&envs, "env", "set KEY=VALUE in the command's environment (repeatable)")
	cwd := fs.String("cwd", "", "working directory, relative to the workspace")
	id := fs.String("id", "", "session id (default: generated by runnerd)")
	tty := fs.Bool("tty", false, "run on a terminal (a PTY): for shells and interactive programs")
	rows := fs.Int("rows", 0, "terminal rows with --tty (default: this terminal's, else 24)")
	cols := fs.Int("cols", 0, "terminal columns with --tty (default: this terminal's, else 80)")
	return func(ctx context.Context, e *env, pos, argv []string) error {
		name := pos[0]
		if !*tty && (*rows != 0 || *cols != 0) {
			return usagef("spawn", "--rows and --cols need --tty")
		}
		req := wire.CreateSession{ID: *id, Argv: argv, Env: envs, Cwd: *cwd, TTY: *tty, Rows: *rows, Cols: *cols}
		if *tty && (req.Rows == 0 || req.Cols == 0) {
			if w, h, err := term.GetSize(int(e.io.out.Fd())); err == nil && w > 0 && h > 0 {
				if req.Rows == 0 {
					req.Rows = h
				}
				if req.Cols == 0 {
					req.Cols = w
				}
			}
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := e.callCtx(ctx)
		defer cancel()
		s, _, err := c.CreateSession(ctx, name, req)
		if err != nil {
			if xe := startFailure(err, "spawn "+name, name, argv[0]); xe != nil {
				return xe
			}
			ce := &cliError{what: "spawn " + name, err: err}
			switch _, kind := codeOf(err); {
			case kind == "unavailable" && req.ID != "":
				ce.hint = hintFor(kind, e.where) + "\n" + fmt.Sprintf("if runnerd got the request the session may exist; retrying the same command with --id %s is safe", req.ID)
			case kind == "unavailable":
				ce.hint = hintFor(kind, e.where) + "\n" + fmt.Sprintf("if runnerd got the request the session may exist: runner sessions %s (give --id to make a retry safe)", name)
			case kind == "not_found":
				ce.hint = noSandboxHint
			}
			return ce
		}
		if e.g.json {
			return e.printJSON(s)
		}
		fmt.Fprintln(e.io.out, s.ID)
		if term.IsTerminal(int(e.io.err.Fd())) {
			if s.TTY {
				fmt.Fprintf(e.io.err, "runner: attach with: runner attach %s %s\n", name, s.ID)
			} else {
				fmt.Fprintf(e.io.err, "runner: follow with: runner logs %s %s -f\n", name, s.ID)
			}
		}
		return nil
	}
}

func sessionsCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return func(ctx context.Context, e *env, pos, _ []string) error {
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := e.callCtx(ctx)
		defer cancel()
		var list []wire.Session
		if len(pos) == 2 {
			s, err := c.Session(ctx, pos[0], pos[1])
			if err != nil {
				return fail("session "+pos[0]+" "+pos[1], err)
			}
			if e.g.json {
				return e.printJSON(s)
			}
			list = []wire.Session{s}
		} else {
			list, err = c.Sessions(ctx, pos[0])
			if err != nil {
				return fail("sessions "+pos[0], err)
			}
			sortByStart(list)
			if e.g.json {
				if list == nil {
					list = []wire.Session{}
				}
				return e.printJSON(list)
			}
			if len(list) == 0 {
				fmt.Fprintf(e.io.out, "no sessions in sandbox %s\n", pos[0])
				return nil
			}
		}
		tw := tabwriter.NewWriter(e.io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tEXIT\tTTY\tOUTPUT\tSTARTED\tCOMMAND")
		for _, s := range list {
			tty := "-"
			if s.TTY {
				tty = "tty"
			}
			state := s.State
			if s.WriteError != "" {
				// Output is waiting for the journal (disk full): the
				// command is held, nothing is dropped.
				state += " (write error: " + s.WriteError + ")"
			}
			if s.StatusError != "" {
				// The daemon could not read its current status: what
				// the row shows is as last recorded.
				state += " (as last recorded; status unreadable: " + s.StatusError + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, state, exitColumn(s), tty, outputColumn(s), when(s.StartedAt), argvString(s.Argv))
		}
		return tw.Flush()
	}
}

// sortByStart orders sessions by start time, oldest first, then by id
// (a session still starting has no start time and comes last). runnerd's
// own order has changed over time (by id, then by start); the CLI holds
// its order either way.
func sortByStart(list []wire.Session) {
	slices.SortStableFunc(list, func(a, b wire.Session) int {
		switch az, bz := a.StartedAt.IsZero(), b.StartedAt.IsZero(); {
		case az && !bz:
			return 1
		case bz && !az:
			return -1
		}
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

func exitColumn(s wire.Session) string {
	if s.Exit == nil {
		return "-"
	}
	var col string
	switch s.Exit.Reason {
	case wire.ExitExited:
		col = fmt.Sprint(s.Exit.Code)
	case wire.ExitSignaled:
		col = fmt.Sprintf("%d (%s)", s.Exit.Code, client.SignalName(s.Exit.Signal))
	default:
		return "lost"
	}
	if s.Exit.Terminated {
		col += ", terminated" // it ended after a terminate, suspend or destroy asked
	}
	return col
}

// outputColumn is how many bytes each stream holds so far ("stdout/stderr",
// or one figure for a terminal session): how far behind a reader is.
func outputColumn(s wire.Session) string {
	lengths := s.Lengths
	if s.Exit != nil && s.Exit.Lengths != nil {
		lengths = s.Exit.Lengths
	}
	if lengths == nil {
		return "-"
	}
	if s.TTY {
		return fmt.Sprint(lengths["stdout"])
	}
	return fmt.Sprintf("%d/%d", lengths["stdout"], lengths["stderr"])
}

// argvString quotes argv for display when an argument needs it.
func argvString(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`;&|<>()*?[]{}!#~") {
			b.WriteString("'" + strings.ReplaceAll(a, "'", `'\''`) + "'")
		} else {
			b.WriteString(a)
		}
	}
	s := b.String()
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

func writeCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	noNewline := fs.Bool("n", false, "do not append a newline to DATA")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		name, id := pos[0], pos[1]
		what := "write " + name + " " + id
		c, err := e.client()
		if err != nil {
			return err
		}
		send := func(p []byte) error {
			cctx, cancel := e.callCtx(ctx)
			defer cancel()
			if err := c.WriteStdin(cctx, name, id, p); err != nil {
				ce := &cliError{what: what, err: err}
				if errors.Is(err, adapter.ErrCommandExited) {
					ce.hint = fmt.Sprintf("the command has ended (or its stdin was closed): runner sessions %s %s", name, id)
				}
				return ce
			}
			return nil
		}
		if len(pos) == 3 && pos[2] != "-" {
			data := pos[2]
			if !*noNewline {
				data += "\n"
			}
			return send([]byte(data))
		}
		buf := make([]byte, 1<<20)
		for {
			n, rerr := e.io.in.Read(buf)
			if n > 0 {
				if err := send(buf[:n]); err != nil {
					return err
				}
			}
			if rerr == io.EOF {
				return nil
			}
			if rerr != nil {
				return &exitError{code: exitOther, kind: "io", what: what, msg: fmt.Sprintf("runner: %s: read stdin: %v", what, rerr)}
			}
		}
	}
}

func simpleSessionCmd(verb string) func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
		return func(ctx context.Context, e *env, pos, _ []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			ctx, cancel := e.callCtx(ctx)
			defer cancel()
			what := verb + " " + pos[0] + " " + pos[1]
			if verb == "signal" {
				err = c.Signal(ctx, pos[0], pos[1], pos[2])
			} else {
				err = c.CloseStdin(ctx, pos[0], pos[1])
			}
			if err != nil {
				return fail(what, err)
			}
			return nil
		}
	}
}

func terminateCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	grace := fs.Duration("grace", 10*time.Second, "time between SIGTERM and SIGKILL (1ms..30s)")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		if *grace <= 0 || *grace > wire.MaxGraceMS*time.Millisecond {
			return usagef("terminate", "--grace %s: want 1ms..30s", *grace)
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, e.g.timeout+*grace+10*time.Second)
		defer cancel()
		what := "terminate " + pos[0] + " " + pos[1]
		x, err := c.Terminate(ctx, pos[0], pos[1], *grace)
		if err != nil {
			ce := &cliError{what: what, err: err}
			if _, kind := codeOf(err); kind == "unavailable" {
				ce.hint = "the end is not confirmed and the session may still run: run terminate again"
			}
			return ce
		}
		if e.g.json {
			return e.printJSON(x)
		}
		switch x.Reason {
		case wire.ExitExited:
			fmt.Fprintf(e.io.out, "%s exited with code %d\n", pos[1], x.Code)
		case wire.ExitSignaled:
			fmt.Fprintf(e.io.out, "%s killed by %s (code %d)\n", pos[1], client.SignalName(x.Signal), x.Code)
		default:
			fmt.Fprintf(e.io.out, "%s lost: ended without an exit record\n", pos[1])
		}
		return nil
	}
}

func logsCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	stream := fs.String("stream", "stdout", "stdout or stderr")
	cursor := fs.Int64("cursor", 0, "byte offset to start from")
	tail := fs.Int64("tail", -1, "start N bytes before the end of the stream instead of at --cursor")
	follow := fs.Bool("f", false, "follow: keep printing until the session ends")
	fs.BoolVar(follow, "follow", false, "same as -f")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		name, id := pos[0], pos[1]
		if *stream != "stdout" && *stream != "stderr" {
			return usagef("logs", "--stream %q: want stdout or stderr", *stream)
		}
		if *cursor < 0 {
			return usagef("logs", "--cursor %d: want a byte offset >= 0", *cursor)
		}
		if *tail < -1 {
			return usagef("logs", "--tail %d: want a byte count >= 0", *tail)
		}
		if *tail >= 0 && *cursor != 0 {
			return usagef("logs", "--tail and --cursor exclude each other")
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		what := "logs " + name + " " + id
		if !*follow {
			var cancel context.CancelFunc
			ctx, cancel = e.callCtx(ctx)
			defer cancel()
		}
		if *tail >= 0 {
			sctx, scancel := e.callCtx(ctx)
			s, err := c.Session(sctx, name, id)
			scancel()
			if err != nil {
				return fail(what, err)
			}
			*cursor = tailCursor(s, *stream, *tail)
		}
		body, err := c.Stream(ctx, name, id, *stream, *cursor, *follow)
		if err != nil {
			ce := &cliError{what: what, err: err}
			if errors.Is(err, adapter.ErrTruncated) {
				ce.hint = "the start of this stream is no longer retained: pass a larger --cursor"
			}
			return ce
		}
		defer body.Close()
		_, cerr := io.Copy(e.io.out, body)
		next := *cursor + body.N()
		if cerr != nil {
			return &cliError{what: what, err: cerr,
				hint: fmt.Sprintf("the connection was cut; resume with: runner logs %s %s --stream %s --cursor %d", name, id, *stream, next)}
		}
		end, err := body.End()
		if err != nil {
			return &cliError{what: what, err: err,
				hint: fmt.Sprintf("resume with: runner logs %s %s --stream %s --cursor %d", name, id, *stream, next)}
		}
		switch end.How {
		case "lost":
			return &exitError{code: exitLost, kind: "lost", what: what, msg: fmt.Sprintf("runner: %s: lost: the session ended without an exit record", what)}
		case "error":
			ce := &cliError{what: what, err: end.Err}
			if errors.Is(end.Err, adapter.ErrTruncated) {
				ce.hint = "retention dropped bytes before they were read: pass a larger --cursor"
			}
			return ce
		}
		return nil
	}
}
