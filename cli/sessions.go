package cli

// The session subcommands: their registration (exec's included; its
// code is in exec.go), spawn, sessions, write, close-stdin, signal,
// terminate, logs and rm-session.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

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
session objects (or one object with ID); [] when there are none. -q prints the
ids only; --format a Go template per session ({{.ID}}, {{.State}}, {{.Argv}},
{{.Exit}}...). runner ps lists the sessions of every sandbox.`,
			setup: sessionsCmd},
		&command{name: "write", args: "NAME ID [DATA | - | --file FILE]", min: 2, max: 3,
			short: "write to a session's stdin (DATA plus a newline, stdin with -, or a file)",
			long: `DATA is written followed by a newline, like echo; -n leaves the newline out.
With - (or no DATA) runner copies its own stdin, exactly, until EOF (it does not
close the session's stdin: use close-stdin for that); --file FILE copies FILE,
exactly.
DATA is in runner's argv, which every process that runs ps can read (sandboxes
too): type a password or a token through - or --file, never as DATA.
Examples:
  runner write web-1 s1 'print(1+1)'
  printf 'raw bytes' | runner write web-1 s1 -
  runner write web-1 s1 --file ~/.secrets/token   # stays out of ps`,
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
		&command{name: "rm-session", args: "NAME ID...", min: 2, max: -1,
			short: "delete ended sessions: their journals and records",
			long: `Only a session that has ended (and left no process behind) can be deleted;
a running one is refused (terminate it first). Deleting a session that does not
exist succeeds. Its output cannot be replayed afterwards: save what you need.
With -f a running session is terminated first (SIGTERM, SIGKILL after 5 s), as
docker rm -f does.
--json prints {"sandbox": NAME, "removed": [ID...]}.`,
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				force := fs.Bool("f", false, "terminate a running session first (SIGTERM, SIGKILL after 5 s)")
				return func(ctx context.Context, e *env, pos, _ []string) error {
					c, err := e.client()
					if err != nil {
						return err
					}
					out := removedSessions{Sandbox: pos[0], Removed: []string{}}
					for _, id := range pos[1:] {
						if *force {
							tctx, cancel := context.WithTimeout(ctx, e.g.timeout+15*time.Second)
							_, err := c.Terminate(tctx, pos[0], id, 5*time.Second)
							cancel()
							if err != nil && !errors.Is(err, adapter.ErrNotFound) {
								return fail("rm-session "+pos[0]+" "+id+": terminate", err)
							}
						}
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

func spawnCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	var ef envFlags
	registerEnvFlags(fs, &ef)
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
		envs, err := ef.resolve("spawn")
		if err != nil {
			return err
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
				ce.hint = hints(hintFor(err, e.where), fmt.Sprintf("if runnerd got the request the session may exist; retrying the same command with --id %s is safe", req.ID))
			case kind == "unavailable":
				ce.hint = hints(hintFor(err, e.where), fmt.Sprintf("if runnerd got the request the session may exist: runner sessions %s (give --id to make a retry safe)", name))
			case kind == "not_found":
				ce.hint = noSandboxHint
			case kind == "invalid":
				ce.hint = e.spawnConflictHint(ctx, c, err, name, req)
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
	lf := registerListFlags(fs, "session ids")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		tmpl, err := lf.template("sessions")
		if err != nil {
			return err
		}
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
			if *lf.quiet || tmpl != nil {
				return printEach(e, list, tmpl, func(s wire.Session) string { return s.ID })
			}
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

func writeCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	noNewline := fs.Bool("n", false, "do not append a newline to DATA")
	file := fs.String("file", "", "write FILE's bytes, exactly (keeps them out of runner's argv)")
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
		in := io.Reader(e.io.in)
		if *file != "" {
			if len(pos) == 3 {
				return usagef("write", "--file and DATA exclude each other")
			}
			f, err := os.Open(*file)
			if err != nil {
				return usagef("write", "--file: %v", err)
			}
			defer f.Close()
			in = f
		} else if len(pos) == 3 && pos[2] != "-" {
			data := pos[2]
			if !*noNewline {
				data += "\n"
			}
			return send([]byte(data))
		}
		buf := make([]byte, min(1<<20, wire.MaxStdinBody))
		for {
			n, rerr := in.Read(buf)
			if n > 0 {
				if err := send(buf[:n]); err != nil {
					return err
				}
			}
			if rerr == io.EOF {
				return nil
			}
			if rerr != nil {
				return &exitError{code: exitOther, kind: "io", what: what, msg: fmt.Sprintf("runner: %s: read input: %v", what, rerr)}
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
