package cli

// Steering a running session: write (stdin), close-stdin, signal and
// terminate.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands,
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
	)
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
				return failHint(what, err, errors.Is(err, adapter.ErrCommandExited),
					fmt.Sprintf("the command has ended (or its stdin was closed): runner sessions %s %s", name, id))
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
		return withClient(func(ctx context.Context, e *env, c *client.Client, pos []string) error {
			what := verb + " " + pos[0] + " " + pos[1]
			var err error
			if verb == "signal" {
				err = c.Signal(ctx, pos[0], pos[1], pos[2])
			} else {
				err = c.CloseStdin(ctx, pos[0], pos[1])
			}
			if err != nil {
				return fail(what, err)
			}
			return nil
		})
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
			return failHint(what, err, kindOf(err) == "unavailable",
				"the end is not confirmed and the session may still run: run terminate again")
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
