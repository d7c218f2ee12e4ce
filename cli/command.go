package cli

// The command table, the help text, and run: one command line to one
// command's body and an exit code.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// command is one subcommand.
type command struct {
	name  string
	args  string // synopsis after the name
	short string
	long  string // extra help text
	// argvAfter > 0: after that many positional arguments the rest of the
	// line is the command to run (an optional "--" before it is dropped).
	argvAfter int
	// nargs bounds the positional arguments (argv excluded); max -1 is
	// unbounded.
	min, max int
	setup    func(fs *flag.FlagSet) func(ctx context.Context, e *env, pos, argv []string) error
}

var commands []*command

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

const topUsage = `runner: drive runnerd, the sandbox and session daemon

Usage: runner [global flags] COMMAND [flags] [args]

Sandboxes:
%s
Sessions (a session is one command in a sandbox, with its output journaled):
%s
Host:
%s
Global flags (accepted before or after the command):
  --url URL          runnerd endpoint: http://HOST:PORT, HOST:PORT, unix:///path or /path
                     (default $RUNNERD_URL, else found on its own)
  --token-file FILE  file holding the bearer token (without it: the token
                     itself from $RUNNERD_TOKEN, else the file STATE/token)
  --ca FILE          CA of runnerd's certificate for https:// (default $RUNNERD_CA)
  --cert FILE, --key FILE
                     client certificate and key for a runnerd with --tls-client-ca
                     (default $RUNNERD_CLIENT_CERT, $RUNNERD_CLIENT_KEY)
  --timeout D        deadline of each call to runnerd (default 30s)
  --json             print JSON for scripts: every command that prints
                     something prints JSON, and an error is one JSON object
                     on stderr ({"error":{"kind":...,"detail":...}})
  --version          print runner's and runnerd's versions (runner version)

Finding the daemon: with no --url and no RUNNERD_URL, runner looks for runnerd's
state directory where runnerd itself would put it ($STATE_DIRECTORY,
$RUNNERD_STATE, $XDG_STATE_HOME/runnerd, ~/.local/state/runnerd,
/var/lib/runnerd), connects where STATE/listen.json says runnerd serves (its
unix socket, else its TCP address; runnerd writes it at every start) and reads
the token from STATE/token. It never guesses an address. The token is never
printed.

Errors print as "runner: <what failed>: <error code>: <detail>".

%s
Run "runner COMMAND --help" for a command's flags and examples.
`

var groups = [][]string{
	{"create", "ls", "get", "rm", "suspend", "resume", "policy", "limits", "url", "checkpoint", "checkpoints", "restore", "fork"},
	{"exec", "run", "spawn", "ps", "sessions", "attach", "logs", "write", "close-stdin", "signal", "terminate", "rm-session"},
	{"info", "caps", "version", "completion"},
}

func printTopUsage(w io.Writer) {
	var sec [3]string
	for i, g := range groups {
		var b strings.Builder
		for _, n := range g {
			c := lookup(n)
			fmt.Fprintf(&b, "  %-12s %s\n", c.name, c.short)
		}
		sec[i] = b.String()
	}
	fmt.Fprintf(w, topUsage, sec[0], sec[1], sec[2], exitTable)
}

// run is the whole CLI: it returns the process exit code. Help asked for
// (--help, help) goes to stdout and exits 0; usage text after a mistake
// goes to stderr and exits 2, so `out=$(runner --bogus ls)` captures
// nothing.
func run(ctx context.Context, args []string, io stdio) int {
	e := &env{io: io}
	asJSON := wantsJSON(args)
	// flagError reports a flag the parser refused: one line, on stderr,
	// that says where the help is (the help itself would bury it).
	flagError := func(cmd string, err error) int {
		return report(io.err, usagef(cmd, "%v", err), "", asJSON)
	}
	// Global flags before the command.
	top := flag.NewFlagSet("runner", flag.ContinueOnError)
	top.SetOutput(discard)
	e.g.register(top)
	showVersion := top.Bool("version", false, "print runner's and runnerd's versions")
	top.Usage = func() {}
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printTopUsage(io.out)
			return exitOK
		}
		return flagError("", err)
	}
	rest := top.Args()
	if *showVersion {
		rest = append([]string{"version"}, rest...)
	}
	if len(rest) == 0 {
		if asJSON {
			writeJSONError(io.err, jsonErrorBody{Kind: "usage", Detail: "no command", ExitCode: exitUsage})
		} else {
			printTopUsage(io.err)
		}
		return exitUsage
	}
	cmd, rest, err := commandOf(rest)
	switch {
	case err != nil:
		return report(io.err, err, "", asJSON)
	case cmd == nil:
		printTopUsage(io.out)
		return exitOK
	}
	fs := e.commandFlags(cmd)
	body := cmd.setup(fs)
	pos, argv, err := parseInterspersed(fs, rest[1:], cmd.argvAfter)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cmdUsage(io.out, cmd, fs)
			return exitOK
		}
		if near := nearFlag(fs, rest[1:]); near != "" {
			err = fmt.Errorf("%w; did you mean %s?", err, near)
		}
		return flagError(cmd.name, err)
	}
	asJSON = e.g.json
	if err := cmd.checkArgs(pos, argv); err != nil {
		return report(io.err, err, "", asJSON)
	}
	if err := body(ctx, e, pos, argv); err != nil {
		return report(io.err, err, e.where, asJSON)
	}
	return exitOK
}

// commandOf is the command rest names, and its command line: "help CMD"
// is "CMD --help". It is nil, with no error, for "help" alone (or help
// with a command runner does not have), which prints the top help.
func commandOf(rest []string) (*command, []string, error) {
	name := rest[0]
	if name == "help" {
		if len(rest) > 1 && lookup(rest[1]) != nil {
			rest = []string{rest[1], "--help"}
			name = rest[0]
		} else {
			return nil, nil, nil
		}
	}
	cmd := lookup(name)
	if cmd == nil {
		msg := fmt.Sprintf("unknown command %q", name)
		if near := nearest(name, names()); near != "" {
			msg += fmt.Sprintf("; did you mean %q?", near)
		}
		return nil, nil, usagef("", "%s", msg)
	}
	return cmd, rest, nil
}

// commandFlags is cmd's flag set before its own flags are added: the
// globals, accepted after the command too, holding the values given
// before it unless repeated after it.
func (e *env) commandFlags(cmd *command) *flag.FlagSet {
	fs := flag.NewFlagSet("runner "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(discard)
	fs.Usage = func() {}
	g0 := e.g
	e.g.register(fs)
	fs.VisitAll(func(f *flag.Flag) {
		switch f.Name {
		case "url":
			_ = f.Value.Set(g0.url)
		case "token-file":
			_ = f.Value.Set(g0.tokenFile)
		case "timeout":
			_ = f.Value.Set(g0.timeout.String())
		case "json":
			_ = f.Value.Set(fmt.Sprint(g0.json))
		case "ca":
			_ = f.Value.Set(g0.tls.CA)
		case "cert":
			_ = f.Value.Set(g0.tls.Cert)
		case "key":
			_ = f.Value.Set(g0.tls.Key)
		}
	})
	return fs
}

// checkArgs refuses a command line with too few or too many positional
// arguments, or without the command to run where cmd takes one.
func (cmd *command) checkArgs(pos, argv []string) error {
	if len(pos) < cmd.min || (cmd.max >= 0 && len(pos) > cmd.max) {
		return usagef(cmd.name, "usage: runner %s %s", cmd.name, cmd.args)
	}
	if cmd.argvAfter > 0 && len(argv) == 0 {
		return usagef(cmd.name, "no command to run: usage: runner %s %s", cmd.name, cmd.args)
	}
	return nil
}

// discard swallows the flag package's own output: run prints its errors
// and usage itself, to the right stream.
var discard = io.Discard

// wantsJSON reports whether --json is on the command line before any
// "--", so that an error found while parsing it is reported as JSON too.
func wantsJSON(args []string) bool {
	on := false
	for _, a := range args {
		if a == "--" {
			break
		}
		switch a {
		case "--json", "-json", "--json=true", "-json=true", "--json=1", "-json=1":
			on = true
		case "--json=false", "-json=false", "--json=0", "-json=0":
			on = false
		}
	}
	return on
}

func names() []string {
	var n []string
	for _, c := range commands {
		n = append(n, c.name)
	}
	sort.Strings(n)
	return n
}

func cmdUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: runner %s %s\n\n%s\n", cmd.name, cmd.args, cmd.short)
	if cmd.long != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.long))
	}
	fmt.Fprintf(w, "\nFlags:\n")
	var global strings.Builder
	fs.VisitAll(func(f *flag.Flag) {
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		line := fmt.Sprintf("  %s%s", dash, f.Name)
		if name, u := flag.UnquoteUsage(f); name != "" {
			line += " " + name
			f.Usage = u
		}
		line = fmt.Sprintf("%-22s %s", line, f.Usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "-1" && f.DefValue != "[]" {
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		switch f.Name {
		case "url", "token-file", "timeout", "json", "ca", "cert", "key":
			global.WriteString(line + "\n")
		default:
			fmt.Fprintln(w, line)
		}
	})
	fmt.Fprintf(w, "\nGlobal flags:\n%s\nExit codes: see runner --help.\n", global.String())
}
