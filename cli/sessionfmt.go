package cli

// How a session's end becomes runner's exit code and message, and how
// `runner sessions` formats its columns.

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// exitOf turns an exit record into runner's exit code and, for anything but
// a plain exit, a message.
// memLimit names the sandbox's memory limit for an OOM kill's message
// ("64MiB"; "of its sandbox" when runner could not read it).
func exitOf(what string, e wire.Exit, memLimit string) (int, string) {
	switch e.Reason {
	case wire.ExitExited:
		return e.Code, ""
	case wire.ExitSignaled:
		code := e.Code
		if code == 0 {
			code = 128 + e.Signal
		}
		if e.OOMKilled {
			return code, fmt.Sprintf("runner: %s: killed by the OOM killer (memory limit %s), exit code %d", what, memLimit, code)
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
func exitErrorOf(what string, x wire.Exit, memLimit string) error {
	code, msg := exitOf(what, x, memLimit)
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
		if s.Exit.OOMKilled {
			col += ", OOM killed"
		}
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

// sessionHeader names the columns of sessionCells (ps puts SANDBOX
// before them).
const sessionHeader = "ID\tSTATE\tEXIT\tTTY\tOUTPUT\tSTARTED\tCOMMAND"

// sessionCells is a session's row in ps and sessions, with state as its
// STATE cell.
func sessionCells(s wire.Session, state string) []string {
	tty := "-"
	if s.TTY {
		tty = "tty"
	}
	return []string{s.ID, state, exitColumn(s), tty, outputColumn(s), when(s.StartedAt), argvString(s.Argv)}
}

// sessionRow is a row of runner sessions: its STATE says too when output
// waits for the journal or the status could not be read.
func sessionRow(s wire.Session) []string {
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
	return sessionCells(s, state)
}
