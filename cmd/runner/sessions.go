package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
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
If the connection to runnerd is lost the outcome is unknown: runner says so and
exits 255 (never 0), naming the session to look at.
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
			long:  `--json prints an array of session objects (or one object with ID).`,
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
		&command{name: "logs", args: "NAME ID [--stream stdout|stderr] [--cursor N] [-f]", min: 2, max: 2,
			short: "print a session's output from a byte cursor; -f follows until it ends",
			long: `Output is replayed byte-exactly from the journal, live or long after the command
ended. A cursor is a byte offset in the stream: resume with --cursor at the
number of bytes you already have. A TTY session has only stdout.
Without -f runner prints what exists now and exits 0. With -f it prints until
the session ends. A session that ended without an exit record (lost) exits 254;
a cut connection exits 255 and says the cursor to resume from.`,
			setup: logsCmd},
		&command{name: "rm-session", args: "NAME ID...", min: 2, max: -1,
			short: "delete ended sessions: their journals and records",
			long: `Only a session that has ended (and left no process behind) can be deleted;
a running one is refused (terminate it first). Deleting a session that does not
exist succeeds. Its output cannot be replayed afterwards: save what you need.`,
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				return func(ctx context.Context, e *env, pos, _ []string) error {
					c, err := e.client()
					if err != nil {
						return err
					}
					for _, id := range pos[1:] {
						cctx, cancel := e.callCtx(ctx) // not below the client's own bound (--timeout plus the delete's wait)
						err := c.DeleteSession(cctx, pos[0], id)
						cancel()
						if err != nil {
							return fail("rm-session "+pos[0]+" "+id, err)
						}
						fmt.Fprintf(e.io.out, "removed session %s\n", id)
					}
					return nil
				}
			}},
	)
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
				return &exitError{code: exitUsage, msg: fmt.Sprintf("runner: exec: read stdin: %v", err)}
			}
			if len(b) > wire.MaxStdinBody {
				return usagef("exec", "-i: stdin is larger than %d bytes; use spawn and write instead", wire.MaxStdinBody)
			}
			req.Stdin = b
		}
		what := "exec " + name
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(sigs)

		ectx, cancel := context.WithCancel(ctx)
		defer cancel()
		type result struct {
			r   wire.ExecResult
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := c.Exec(ectx, name, req)
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
					return &exitError{code: exitInterrupted, msg: fmt.Sprintf(
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
			if err := e.printJSON(r); err != nil {
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
		for _, t := range []struct {
			trunc  bool
			stream string
		}{{r.StdoutTruncated, "stdout"}, {r.StderrTruncated, "stderr"}} {
			if t.trunc {
				fmt.Fprintf(e.io.err, "runner: %s: %s was cut at %d MiB; the rest: runner logs %s %s --stream %s --cursor %d\n",
					what, t.stream, wire.MaxExecOutput>>20, name, r.Session, t.stream, wire.MaxExecOutput)
			}
		}
		if r.TimedOut {
			fmt.Fprintf(e.io.err, "runner: %s: terminated after --max-time %s\n", what, *maxTime)
		}
		code, msg := exitOf(what, r.Exit)
		if code == 0 && msg == "" {
			return nil
		}
		return &exitError{code: code, msg: msg}
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
			if e.g.json {
				if list == nil {
					list = []wire.Session{}
				}
				return e.printJSON(list)
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
				return &exitError{code: exitOther, msg: fmt.Sprintf("runner: %s: read stdin: %v", what, rerr)}
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
			return &exitError{code: exitLost, msg: fmt.Sprintf("runner: %s: lost: the session ended without an exit record", what)}
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
