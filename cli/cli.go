package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// Exit codes of runner's own failures, named here for this package's use;
// their values, and which kind gets which, are wire.ErrorTable's (the one
// error table). They sit at the top of the range so that they rarely
// collide with the exit code of a command that exec and attach pass
// through; usage errors are 2, as for most Unix tools.
const (
	exitOK            = wire.RunnerExitOK
	exitUsage         = wire.RunnerExitUsage
	exitNotExecutable = wire.RunnerExitNotExecutable
	exitCmdNotFound   = wire.RunnerExitCommandNotFound
	exitInterrupted   = wire.RunnerExitInterrupted
	exitDetached      = wire.RunnerExitDetached
	exitOther         = wire.RunnerExitOther
	exitRateLimited   = wire.RunnerExitRateLimited
	exitTruncated     = wire.RunnerExitTruncated
	exitCommandExited = wire.RunnerExitCommandExited
	exitNotSupported  = wire.RunnerExitNotSupported
	exitDenied        = wire.RunnerExitDenied
	exitInvalid       = wire.RunnerExitInvalid
	exitNotFound      = wire.RunnerExitNotFound
	exitLost          = wire.RunnerExitLost
	exitUnavailable   = wire.RunnerExitUnavailable
	// exitBrokenPipe is runner's exit when its stdout or stderr pipe
	// closed under it: 128+SIGPIPE, what a shell shows for a command
	// SIGPIPE killed, so `runner exec box -- yes | head -1` reads as
	// `yes | head -1` does.
	exitBrokenPipe = 128 + int(syscall.SIGPIPE)
)

const exitTable = `Exit codes:
  exec and attach exit with the command's own code (128+N when signal N killed it).
  Otherwise, and when runner itself fails:
    0    success
    2    usage: bad flags or arguments (also a request runner itself refuses
         to send)
    126  exec, spawn: the command exists but cannot be run (not executable)
    127  exec, spawn: the command was not found in the sandbox
    130  interrupted (Ctrl-C); a command started by exec may still run
    141  runner's stdout or stderr pipe closed (runner exec ... | head -1):
         exec and run ended the command they started first (SIGPIPE, then
         terminate); attach and logs leave the session running
    245  attach, exec -it, run: detached (the detach key on a terminal,
         Ctrl-C or SIGTERM on an attach without one); the session still runs
    246  provider, restore_failed or write_failed
    247  rate_limited
    248  truncated: the cursor is behind the retained output
    249  command_exited: stdin/signal reached a command that has ended
    250  not_supported: this host cannot do that (see runner caps)
    251  denied: wrong or missing token
    252  invalid: the request was refused as malformed or conflicting
    253  not_found: no such sandbox or session (definitive)
    254  lost: the session ended without an exit record (never a success)
    255  unavailable: runnerd unreachable, timed out, or the connection was
         cut; the outcome is unknown
`

// stdio is where a command reads and writes. Terminal handling (attach)
// needs real files.
type stdio struct {
	in       *os.File
	out, err *os.File
}

// cliError is a failure to report as "runner: <what>: <code>: <detail>",
// optionally followed by a hint line.
type cliError struct {
	what string
	err  error
	hint string
	code int // exit code; 0 means derive it from err
}

func (e *cliError) Error() string { return e.what + ": " + e.err.Error() }
func (e *cliError) Unwrap() error { return e.err }

// fail wraps err with what was being done.
func fail(what string, err error) error { return &cliError{what: what, err: err} }

// usageError is a mistake in the command line.
type usageError struct{ cmd, msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// exitError ends runner with a code and an optional message (already
// formatted, printed as is when not empty). kind names runner's failure
// for --json's error object; it is "" when the code is the command's own
// (a signal's 128+N), which --json does not report as an error.
type exitError struct {
	code int
	msg  string
	kind string
	// Optional, for --json: what failed, the detail (else taken from
	// msg), and a wire.ExecError.
	what, detail string
	execError    wire.ExecError
}

func (e *exitError) Error() string { return e.msg }

// codeOf returns the exit code and the wire name of err's kind, from
// wire.ErrorTable.
func codeOf(err error) (int, string) {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return exitUnavailable, "unavailable"
	case errors.Is(err, context.Canceled):
		return exitInterrupted, "interrupted"
	}
	if c, ok := stream.Code(adapter.KindOf(err)); ok {
		if row, ok := wire.RowOf(c); ok {
			return row.Exit, string(c)
		}
	}
	return exitOther, "provider"
}

// detailOf returns the human part of err: runnerd's own detail when it
// answered, else the classified error's text without its kind prefix.
func detailOf(err error) string {
	var api *client.APIError
	if errors.As(err, &api) {
		if api.Detail != "" {
			return api.Detail
		}
		return fmt.Sprintf("HTTP %d", api.Status)
	}
	var (
		un *adapter.UnavailableError
		in *adapter.InvalidError
		de *adapter.DeniedError
		rl *adapter.RateLimitedError
	)
	switch {
	case errors.As(err, &un):
		return un.Detail
	case errors.As(err, &in):
		return in.Detail
	case errors.As(err, &de):
		return de.Detail
	case errors.As(err, &rl):
		if rl.RetryAfter > 0 {
			return "retry after " + rl.RetryAfter.String()
		}
		return "slow down"
	case errors.Is(err, context.DeadlineExceeded):
		return "no answer in time (raise --timeout)"
	}
	return err.Error()
}

// jsonError is the object runner prints on stderr, as one line, when a
// command run with --json fails: {"error": {...}}.
type jsonError struct {
	Error jsonErrorBody `json:"error"`
}

// jsonErrorBody: Kind is a wire code (not_found, invalid, unavailable,
// ...), or one of runner's own: usage, interrupted, detached, lost, io.
type jsonErrorBody struct {
	Kind      string         `json:"kind"`
	Op        string         `json:"op,omitempty"`
	Detail    string         `json:"detail"`
	ExitCode  int            `json:"exit_code"`
	Hint      string         `json:"hint,omitempty"`
	ExecError wire.ExecError `json:"exec_error,omitempty"`
}

func writeJSONError(w io.Writer, b jsonErrorBody) {
	out, err := json.Marshal(jsonError{Error: b})
	if err != nil { // cannot happen: strings and ints only
		out = []byte(`{"error":{"kind":"provider","detail":"encode the error","exit_code":246}}`)
	}
	fmt.Fprintf(w, "%s\n", out)
}

// writeJSONWarning prints a warning in --json mode: {"warning": msg}, one
// line on stderr.
func writeJSONWarning(e *env, msg string) {
	out, _ := json.Marshal(struct {
		Warning string `json:"warning"`
	}{msg})
	fmt.Fprintf(e.io.err, "%s\n", out)
}

// report prints err to w and returns the exit code: text, or with asJSON
// one JSON object (jsonError). where names the daemon runner tried (""
// before it knew), for the unavailable hint.
func report(w io.Writer, err error, where string, asJSON bool) int {
	if errors.Is(err, errBrokenPipe) || (errors.Is(err, syscall.EPIPE) && !errors.Is(err, adapter.ErrUnavailable)) {
		// runner's own stdout or stderr went away: nobody reads a
		// message, and the shell reads 141 as a SIGPIPE death.
		return exitBrokenPipe
	}
	var ue *usageError
	if errors.As(err, &ue) {
		if asJSON {
			op := ""
			if ue.cmd != "" {
				op = ue.cmd
			}
			writeJSONError(w, jsonErrorBody{Kind: "usage", Op: op, Detail: ue.msg, ExitCode: exitUsage})
		} else if ue.cmd != "" {
			fmt.Fprintf(w, "runner %s: %s (see runner %s --help)\n", ue.cmd, ue.msg, ue.cmd)
		} else {
			fmt.Fprintf(w, "runner: %s (see runner --help)\n", ue.msg)
		}
		return exitUsage
	}
	var xe *exitError
	if errors.As(err, &xe) {
		switch {
		case asJSON && xe.kind != "":
			detail := xe.detail
			if detail == "" {
				first, rest, _ := strings.Cut(strings.TrimSpace(xe.msg), "\n")
				detail = strings.TrimPrefix(first, "runner: ")
				if xe.what != "" {
					detail = strings.TrimPrefix(detail, xe.what+": ")
				}
				if rest != "" {
					detail += " " + oneLine(strings.ReplaceAll(strings.ReplaceAll(rest, "\r", ""), "runner: ", ""))
				}
			}
			writeJSONError(w, jsonErrorBody{Kind: xe.kind, Op: xe.what, Detail: strings.TrimSpace(detail), ExitCode: xe.code, ExecError: xe.execError})
		case asJSON:
			// The command's own status (128+N): --json output already
			// says how it ended; it is not runner's error.
		case xe.msg != "":
			fmt.Fprintln(w, strings.TrimRight(xe.msg, "\n"))
		}
		return xe.code
	}
	code, kind := codeOf(err)
	what := ""
	var ce *cliError
	if errors.As(err, &ce) {
		what = ce.what
		if ce.code != 0 {
			code = ce.code
		}
	}
	inner := err
	if ce != nil {
		inner = ce.err
	}
	detail := dropKind(tidy(oneLine(detailOf(inner))), kind)
	hint := hintFor(err, where)
	if ce != nil && ce.hint != "" {
		hint = ce.hint
	}
	var api *client.APIError
	if errors.As(err, &api) && api.ExecError != "" {
		detail += " (exec_error: " + string(api.ExecError) + ")"
	}
	if asJSON {
		writeJSONError(w, jsonErrorBody{Kind: kind, Op: what, Detail: detail, ExitCode: code, Hint: hint})
		return code
	}
	if what != "" {
		what += ": "
	}
	fmt.Fprintf(w, "runner: %s%s: %s\n", what, kind, detail)
	for _, h := range strings.Split(hint, "\n") {
		if h != "" {
			fmt.Fprintf(w, "runner: hint: %s\n", h)
		}
	}
	return code
}

// opPrefix and urlPrefix are the request names the client puts before a
// transport error ("GET /v1/sandboxes: Get \"http://...\": dial ...");
// tidy drops them from what people read (display only: errors are
// classified by kind, never by text).
var (
	opPrefix = regexp.MustCompile(`^(GET|POST|PUT|DELETE) /\S*: `)
	// apiAdvice is runnerd's advice to API callers inside a detail
	// ("(change it with PUT /v1/sandboxes/x/network)"): runner's hint
	// names its own command instead.
	apiAdvice = regexp.MustCompile(` \(change (it|them) with (GET|POST|PUT|DELETE) /v1/[^)]*\)`)
	urlPrefix = regexp.MustCompile(`(Get|Post|Put|Delete) "[^"]*": `)
)

// dropKind drops kind from the ends of detail ("invalid: x: invalid"
// is "x"): runner prints the kind once, before the detail (display
// only).
func dropKind(detail, kind string) string {
	for {
		d := strings.TrimPrefix(strings.TrimSuffix(detail, ": "+kind), kind+": ")
		if d == detail || d == "" {
			return detail
		}
		detail = d
	}
}

func tidy(s string) string {
	s = opPrefix.ReplaceAllString(s, "")
	s = apiAdvice.ReplaceAllString(s, "")
	return urlPrefix.ReplaceAllString(s, "")
}

// hintFor is runner's advice for err, "" when it has none. "Is runnerd
// running?" is only for a connection nothing accepted: a runnerd that
// answered (a 503 with its detail) or cut the connection is running.
func hintFor(err error, where string) string {
	switch _, kind := codeOf(err); kind {
	case "unavailable":
		if !client.Refused(err) {
			return ""
		}
		if pid, ok := daemonStarting(); ok {
			return startingHint(pid)
		}
		if where != "" {
			where = " at " + where
		}
		return "is runnerd running" + where + "? start it with `runnerd`, or point runner at it with --url or RUNNERD_URL"
	case "denied":
		return "the token does not match the daemon's: use --token-file STATE/token or RUNNERD_TOKEN"
	case "not_supported":
		return "`runner caps` lists what this runnerd can do"
	}
	return ""
}

// stateDir is the state directory runner found runnerd by ("" when
// --url and a token named it): where it looks whether runnerd is
// starting.
var stateDir string

// daemonStarting reports whether the runnerd of stateDir is starting
// (client.Starting): a refused connection then means "wait", not "is it
// running?".
func daemonStarting() (int, bool) {
	if stateDir == "" {
		return 0, false
	}
	return client.Starting(stateDir)
}

func startingHint(pid int) string {
	return fmt.Sprintf("runnerd (pid %d) is starting: it serves once it has recovered its sandboxes and sessions; retry in a moment", pid)
}

// reconnectGiveUp reports whether a reconnect that began at lostAt
// has waited long enough: reconnectFor, and longer while runnerd says
// it is starting (a restart that recovers many sessions), up to
// startingFor.
func reconnectGiveUp(lostAt time.Time) bool {
	waited := time.Since(lostAt)
	if waited <= reconnectFor {
		return false
	}
	_, starting := daemonStarting()
	return !starting || waited > startingFor
}

// startingFor bounds the wait for a runnerd that says it is starting.
const startingFor = 10 * time.Minute

// hints joins hint lines, leaving out empty ones.
func hints(lines ...string) string {
	var keep []string
	for _, l := range lines {
		if l != "" {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func oneLine(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), "\n", " ") }

// globals are the flags every command accepts.
type globals struct {
	url       string
	tokenFile string
	timeout   time.Duration
	json      bool
	tls       client.TLSFiles // --ca, --cert, --key over RUNNERD_CA, RUNNERD_CLIENT_CERT, RUNNERD_CLIENT_KEY
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.url, "url", "", "runnerd endpoint: http://HOST:PORT or unix:///path/runnerd.sock (default $RUNNERD_URL, else found on its own)")
	fs.StringVar(&g.tokenFile, "token-file", "", "file holding the bearer token (without it: the token itself from $RUNNERD_TOKEN, else the file STATE/token)")
	fs.DurationVar(&g.timeout, "timeout", client.DefaultRequestTimeout, "deadline of each call to runnerd (exec, attach and logs -f wait for the command instead)")
	fs.StringVar(&g.tls.CA, "ca", "", "PEM file of the CA that signed runnerd's certificate, for an https:// endpoint (default $RUNNERD_CA, else the host's roots)")
	fs.StringVar(&g.tls.Cert, "cert", "", "PEM client certificate for a runnerd with --tls-client-ca (default $RUNNERD_CLIENT_CERT)")
	fs.StringVar(&g.tls.Key, "key", "", "PEM key of --cert (default $RUNNERD_CLIENT_KEY)")
	fs.BoolVar(&g.json, "json", false, "print JSON for scripts: every command that prints something, and errors (one object on stderr)")
}

// env is what a command runs with: the parsed globals, stdio, and a lazily
// made client.
type env struct {
	g   globals
	io  stdio
	cli *client.Client
	// where is the endpoint (and state directory) the client was made
	// for, for messages.
	where string
}

// client resolves the daemon's endpoint and token: flags, then environment,
// then client.Discover (the state directory runnerd uses by default).
func (e *env) client() (*client.Client, error) {
	if e.cli != nil {
		return e.cli, nil
	}
	endpoint := e.g.url
	if endpoint == "" {
		endpoint = os.Getenv(client.EnvURL)
	}
	endpoint = normalizeEndpoint(endpoint)
	token := os.Getenv(client.EnvToken)
	if e.g.tokenFile != "" {
		b, err := os.ReadFile(e.g.tokenFile)
		if err != nil {
			return nil, &exitError{code: exitUsage, kind: "usage", msg: fmt.Sprintf("runner: read --token-file: %v", err)}
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, &exitError{code: exitUsage, kind: "usage", msg: fmt.Sprintf("runner: read --token-file: %s is empty", e.g.tokenFile)}
		}
	}
	if endpoint == "" || token == "" {
		// Look only for what the flags and environment did not give.
		l, err := client.DiscoverFor(endpoint, token)
		var starting *client.StartingError
		if errors.As(err, &starting) {
			stateDir = starting.Dir
			return nil, &cliError{what: "find runnerd", err: &adapter.UnavailableError{Detail: err.Error()},
				hint: startingHint(starting.PID), code: exitUnavailable}
		}
		var denied *client.StateDeniedError
		if errors.As(err, &denied) {
			hint := fmt.Sprintf("runnerd's state (%s) is another user's: run runner as that user, or use --token-file with a copy of its token", denied.Dir)
			if denied.UID == 0 {
				hint = fmt.Sprintf("runnerd runs as root and its state (%s) is root's: use sudo (sudo runner ...), or --token-file with a copy of its token", denied.Dir)
			}
			return nil, &cliError{what: "find runnerd", err: &adapter.DeniedError{Detail: err.Error()}, hint: hint}
		}
		if err != nil {
			return nil, &cliError{what: "find runnerd", err: &adapter.UnavailableError{Detail: err.Error()},
				hint: "is runnerd running? start it with `runnerd` (it writes its token into its state directory), or use --url and --token-file (RUNNERD_URL, RUNNERD_TOKEN)", code: exitUnavailable}
		}
		endpoint, token = l.Endpoint, l.Token()
		stateDir = l.StateDir
	}
	opts := client.Options{RequestTimeout: e.g.timeout, UserAgent: "runner-cli"}
	files := client.TLSFromEnv()
	if e.g.tls.CA != "" {
		files.CA = e.g.tls.CA
	}
	if e.g.tls.Cert != "" || e.g.tls.Key != "" {
		files.Cert, files.Key = e.g.tls.Cert, e.g.tls.Key
	}
	if err := files.Apply(&opts); err != nil {
		return nil, usagef("", "%v", err)
	}
	c, err := client.New(endpoint, token, opts)
	if err != nil {
		return nil, usagef("", "--url: %v", err)
	}
	e.cli = c
	e.where = endpoint
	return c, nil
}

// normalizeEndpoint accepts HOST:PORT and /path/to.sock as shorthands.
func normalizeEndpoint(s string) string {
	switch {
	case s == "":
		return ""
	case strings.HasPrefix(s, "/"):
		return "unix://" + s
	case !strings.Contains(s, "://"):
		return "http://" + s
	}
	return s
}

// callCtx bounds one short call. The client applies --timeout per request
// too; this bounds a command that makes several.
func (e *env) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.g.timeout+5*time.Second)
}

func (e *env) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = e.io.out.Write(b)
	return err
}

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
	{"create", "ls", "get", "rm", "suspend", "resume", "policy", "limits", "url", "checkpoint", "checkpoints", "restore"},
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
	name := rest[0]
	if name == "help" {
		if len(rest) > 1 && lookup(rest[1]) != nil {
			rest = []string{rest[1], "--help"}
			name = rest[0]
		} else {
			printTopUsage(io.out)
			return exitOK
		}
	}
	cmd := lookup(name)
	if cmd == nil {
		msg := fmt.Sprintf("unknown command %q", name)
		if near := nearest(name, names()); near != "" {
			msg += fmt.Sprintf("; did you mean %q?", near)
		}
		return report(io.err, usagef("", "%s", msg), "", asJSON)
	}
	fs := flag.NewFlagSet("runner "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(discard)
	g0 := e.g
	e.g.register(fs) // the same globals, accepted after the command too
	// Keep values given before the command unless repeated after it.
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
	body := cmd.setup(fs)
	fs.Usage = func() {}
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
	if len(pos) < cmd.min || (cmd.max >= 0 && len(pos) > cmd.max) {
		return report(io.err, usagef(cmd.name, "usage: runner %s %s", cmd.name, cmd.args), "", asJSON)
	}
	if cmd.argvAfter > 0 && len(argv) == 0 {
		return report(io.err, usagef(cmd.name, "no command to run: usage: runner %s %s", cmd.name, cmd.args), "", asJSON)
	}
	if err := body(ctx, e, pos, argv); err != nil {
		return report(io.err, err, e.where, asJSON)
	}
	return exitOK
}

// stdioWriter is where usage text goes: stdout for --help, stderr after
// a mistake.
type stdioWriter = io.Writer

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

// nearFlag is the flag of fs nearest to the first flag in args that fs
// does not define ("--detach-ky" gives "--detach-key"), "" when there is
// no such flag or none is close. It reads the command line, not the
// flag package's error text.
func nearFlag(fs *flag.FlagSet, args []string) string {
	var all []string
	fs.VisitAll(func(f *flag.Flag) { all = append(all, f.Name) })
	for _, a := range args {
		if a == "--" {
			return ""
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "" || fs.Lookup(name) != nil {
			continue
		}
		if len(name) > 1 && a[1] != '-' && allBoolLetters(fs, name) {
			continue // -it: combined one-letter flags
		}
		// A one- or two-letter slip ("-iz") has too many neighbours
		// for a suggestion to help.
		if near := nearest(name, all); len(name) > 2 && len(near) > 1 {
			return dash(near)
		}
		return ""
	}
	return ""
}

// allBoolLetters reports whether each letter of s is a boolean flag of
// fs (so "-it" is -i -t, not a flag named "it").
func allBoolLetters(fs *flag.FlagSet, s string) bool {
	for _, r := range s {
		f := fs.Lookup(string(r))
		if f == nil {
			return false
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			return false
		}
	}
	return true
}

// nearest is the command name closest to a mistyped one: within two
// edits (a transposition is one), or the only command it is a prefix of;
// "" when none is close enough to be worth suggesting.
func nearest(typed string, all []string) string {
	best, bestD := "", 3
	var prefixed []string
	for _, n := range all {
		if strings.HasPrefix(n, typed) {
			prefixed = append(prefixed, n)
		}
		if d := editDistance(typed, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" && len(prefixed) == 1 {
		return prefixed[0]
	}
	return best
}

// editDistance is the optimal-string-alignment distance: insertions,
// deletions, substitutions and transpositions of neighbours each cost 1.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
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

// parseInterspersed parses flags anywhere among the positional arguments.
// With argvAfter > 0, once that many positional arguments are seen the rest
// of the line (after an optional "--") is returned as argv, unparsed, so
// `runner exec box ls -la` runs `ls -la`.
func parseInterspersed(fs *flag.FlagSet, args []string, argvAfter int) (pos, argv []string, err error) {
	for {
		args = expandShort(fs, args)
		if argvAfter > 0 && len(pos) == argvAfter {
			// Flags may still come before the command; the first
			// non-flag (or what follows "--") starts it.
			if err := fs.Parse(args); err != nil {
				return nil, nil, err
			}
			return pos, fs.Args(), nil
		}
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil, nil
		}
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			// An explicit end of flags: everything after is positional,
			// or the command line for exec/spawn.
			for len(rest) > 0 && (argvAfter == 0 || len(pos) < argvAfter) {
				pos, rest = append(pos, rest[0]), rest[1:]
			}
			return pos, rest, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// expandShort splits combined one-letter boolean flags ("-it" into "-i",
// "-t", as docker and POSIX getopt take them) among the flags the parser
// reads next: the run of flag arguments at the start of args, up to the
// first non-flag or "--". What follows (a command's own "-la") is left
// as it is. A token that names a flag itself is never split.
func expandShort(fs *flag.FlagSet, args []string) []string {
	isBool := func(name string) bool {
		f := fs.Lookup(name)
		if f == nil {
			return false
		}
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		return ok && b.IsBoolFlag()
	}
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		name, _, hasValue := strings.Cut(name, "=")
		if fs.Lookup(name) != nil {
			out = append(out, a)
			if !hasValue && !isBool(name) && i+1 < len(args) {
				i++ // the flag's value
				out = append(out, args[i])
			}
			continue
		}
		combined := a[1] != '-' && !hasValue && len(name) > 1
		for _, r := range name {
			if !isBool(string(r)) {
				combined = false
				break
			}
		}
		if !combined {
			return append(out, args[i:]...) // the parser reports it
		}
		for _, r := range name {
			out = append(out, "-"+string(r))
		}
	}
	return out
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
