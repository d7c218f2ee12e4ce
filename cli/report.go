package cli

// How runner ends: the exit statuses (wire.ErrorTable's), the error types
// commands return, and report, which prints an error as text or --json and
// gives the exit code.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"syscall"

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

// failHint is fail with hint, told when the error is one the hint
// answers (a kind of err from kindOf, or an errors.Is), and only then.
func failHint(what string, err error, when bool, hint string) error {
	ce := &cliError{what: what, err: err}
	if when {
		ce.hint = hint
	}
	return ce
}

// kindOf is the name of err's kind, as codeOf gives it.
func kindOf(err error) string {
	_, kind := codeOf(err)
	return kind
}

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
		return reportUsage(w, ue, asJSON)
	}
	var xe *exitError
	if errors.As(err, &xe) {
		return reportExit(w, xe, asJSON)
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

// reportUsage prints a mistake in the command line: one line that says
// where the help is, or --json's usage error.
func reportUsage(w io.Writer, ue *usageError, asJSON bool) int {
	if asJSON {
		writeJSONError(w, jsonErrorBody{Kind: "usage", Op: ue.cmd, Detail: ue.msg, ExitCode: exitUsage})
	} else if ue.cmd != "" {
		fmt.Fprintf(w, "runner %s: %s (see runner %s --help)\n", ue.cmd, ue.msg, ue.cmd)
	} else {
		fmt.Fprintf(w, "runner: %s (see runner --help)\n", ue.msg)
	}
	return exitUsage
}

// reportExit prints an exitError's message (or --json's error object,
// none for the command's own status) and returns its code.
func reportExit(w io.Writer, xe *exitError, asJSON bool) int {
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

func startingHint(pid int) string {
	return fmt.Sprintf("runnerd (pid %d) is starting: it serves once it has recovered its sandboxes and sessions; retry in a moment", pid)
}

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
