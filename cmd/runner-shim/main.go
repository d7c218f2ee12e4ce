// Command runner-shim runs commands as detached, journaled sessions and
// drives them from a shell: the standalone form of package shim, for
// sandboxes whose only interface is a plain exec API. Each subcommand
// parses its flags and makes one call into package shim.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

const usage = `runner-shim: run commands as detached, journaled sessions.

Usage: runner-shim [--root DIR] COMMAND [flags] [args]

Sessions live in DIR/ID (default root: $RUNNER_SHIM_ROOT, else
/var/lib/runner-shim for root, else $XDG_STATE_HOME/runner-shim or
~/.local/state/runner-shim). Keep DIR short: the control socket path
DIR/ID/ctl.sock must fit in 107 bytes.

Commands:
  spawn [--id ID] [--tty] [--rows N] [--cols N] [--cwd DIR] [--user U]
        [--env K=V]... [--clear-env] [--netns PATH] [--retain BYTES] -- ARGV...
      Start ARGV (no shell) as a detached session. Prints the session id
      only once the command runs; a command that cannot start (no such
      file) is an error and leaves nothing behind. The environment is
      runner-shim's own unless --clear-env, plus each --env.
  attach [--stdout N] [--stderr M] [--text] [--heartbeat DUR] ID
      Replay the session from the cursors (default 0) and follow it live.
      Writes the binary frame stream of docs/frames.md to stdout, ending
      with exactly one terminal frame (exit, lost or error). --text writes
      raw stdout/stderr bytes instead and exits with the command's status
      (128+signal if killed, 255 if lost, 254 on an error frame).
  write ID [DATA...]
      Write DATA (the arguments joined by spaces, no newline added) to the
      command's stdin, or, with no DATA, copy runner-shim's own stdin.
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
      Print the session's status as JSON, with the exit record when known.
  list
      Print every session's status, one JSON object per line.
  serve [--detach] [--ready-fd N] DIR
      Internal: the shim process itself (what spawn starts).

Exit status: 0 success, 1 failure, 2 usage, 3 the command has exited
(write, close-stdin, signal, resize after the end), 4 the session is lost
(wire.ShimExit* name them for programs that drive runner-shim).
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		os.Exit(shim.Main(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	top := flag.NewFlagSet("runner-shim", flag.ContinueOnError)
	top.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	root := top.String("root", shim.DefaultRoot(), "session root directory")
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return wire.ShimExitOK
		}
		return wire.ShimExitUsage
	}
	if top.NArg() == 0 {
		top.Usage()
		return wire.ShimExitUsage
	}
	cmd, args := top.Arg(0), top.Args()[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	dirOf := func(id string) string { return filepath.Join(*root, id) }
	// pos parses flags and wants at least n positional arguments, the
	// first a session id (but for spawn: the command's argv).
	pos := func(n int) ([]string, bool) {
		if err := fs.Parse(args); err != nil {
			return nil, false
		}
		if fs.NArg() < n || (n > 0 && cmd != "spawn" && !shim.ValidID(fs.Arg(0))) {
			fmt.Fprintf(os.Stderr, "runner-shim %s: want %d argument(s), the first a session id\n", cmd, n)
			return nil, false
		}
		return fs.Args(), true
	}

	switch cmd {
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
		var env multi
		fs.Var(&env, "env", "K=V added to the environment (repeatable)")
		argv, ok := pos(1)
		if !ok {
			return wire.ShimExitUsage
		}
		if *id == "" {
			*id = randomID()
		}
		spec := shim.Spec{ID: *id, Argv: argv, Dir: *cwd, User: *user, TTY: *tty,
			Rows: uint16(*rows), Cols: uint16(*cols), NetNS: *netns, RetainBytes: *retain}
		if !*clearEnv {
			spec.Env = os.Environ()
		}
		spec.Env = append(spec.Env, env...)
		exe, err := os.Executable()
		if err != nil {
			return fail(cmd, err)
		}
		if _, err := shim.Start(ctx, []string{exe, "serve"}, dirOf(*id), spec); err != nil {
			return fail(cmd, err)
		}
		fmt.Println(*id)
		return wire.ShimExitOK

	case "attach":
		so := fs.Int64("stdout", 0, "stdout cursor")
		se := fs.Int64("stderr", 0, "stderr cursor")
		text := fs.Bool("text", false, "write raw bytes to stdout/stderr and exit with the command's status")
		hb := fs.Duration("heartbeat", shim.DefaultHeartbeat, "heartbeat after this much silence (frames mode)")
		a, ok := pos(1)
		if !ok {
			return wire.ShimExitUsage
		}
		opts := shim.AttachOptions{Stdout: *so, Stderr: *se, Heartbeat: *hb}
		if *text {
			status, err := shim.AttachText(ctx, dirOf(a[0]), opts, os.Stdout, os.Stderr)
			if err != nil {
				return fail(cmd, err)
			}
			return status
		}
		if err := shim.Attach(ctx, dirOf(a[0]), opts, writeAll); err != nil {
			return fail(cmd, err)
		}
		return wire.ShimExitOK

	case "write", "close-stdin", "signal", "resize", "terminate", "status":
		grace := fs.Duration("grace", 10*time.Second, "terminate: time between SIGTERM and SIGKILL")
		want := map[string]int{"write": 1, "close-stdin": 1, "signal": 2, "resize": 3, "terminate": 1, "status": 1}[cmd]
		a, ok := pos(want)
		if !ok {
			return wire.ShimExitUsage
		}
		c, err := shim.Dial(ctx, dirOf(a[0]))
		if err != nil {
			return fail(cmd, err)
		}
		defer c.Close()
		switch cmd {
		case "write":
			if len(a) > 1 {
				err = c.WriteStdin(ctx, []byte(strings.Join(a[1:], " ")))
			} else {
				err = shim.CopyStdin(ctx, c, os.Stdin)
			}
		case "close-stdin":
			err = c.CloseStdin(ctx)
		case "signal":
			sig, perr := parseSignal(a[1])
			if perr != nil {
				return fail(cmd, perr)
			}
			err = c.Signal(ctx, sig)
		case "resize":
			r, err1 := strconv.ParseUint(a[1], 10, 16)
			cl, err2 := strconv.ParseUint(a[2], 10, 16)
			if err1 != nil || err2 != nil {
				return fail(cmd, errors.New("rows and cols are numbers 1-65535"))
			}
			err = c.Resize(ctx, uint16(r), uint16(cl))
		case "terminate":
			e, terr := c.Terminate(ctx, *grace)
			if terr == nil {
				printJSON(e)
			}
			err = terr
		case "status":
			st, serr := c.Status(ctx)
			if serr == nil {
				printJSON(st)
			}
			err = serr
		}
		if err != nil {
			return fail(cmd, err)
		}
		return wire.ShimExitOK

	case "list":
		if _, ok := pos(0); !ok {
			return wire.ShimExitUsage
		}
		list, err := shim.List(*root)
		if err != nil {
			return fail(cmd, err)
		}
		for _, st := range list {
			b, _ := json.Marshal(st)
			fmt.Println(string(b))
		}
		return wire.ShimExitOK

	case "help", "-h", "--help":
		fmt.Print(usage)
		return wire.ShimExitOK
	}
	fmt.Fprintf(os.Stderr, "runner-shim: unknown command %q\n\n%s", cmd, usage)
	return wire.ShimExitUsage
}

func writeAll(b []byte) error {
	_, err := os.Stdout.Write(b)
	return err
}

// fail reports err and returns its exit status from wire.ErrorTable
// (ShimExitCommandExited, ShimExitLost, else ShimExitFailure).
func fail(cmd string, err error) int {
	fmt.Fprintf(os.Stderr, "runner-shim %s: %v\n", cmd, err)
	if row, ok := wire.RowOf(shim.CodeOf(err)); ok && row.ShimExit != wire.ShimExitOK {
		return row.ShimExit
	}
	return wire.ShimExitFailure
}

func printJSON(v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Println(string(b))
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func parseSignal(s string) (syscall.Signal, error) {
	n, err := wire.ParseSignal(s)
	return syscall.Signal(n), err
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }
