package cli

// Hints for a 409 invalid, one per conflict the daemon names
// (wire.Error.Reason): a suspended sandbox is not a reused session id.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// reasonOf is the conflict reason of a 409 invalid answer, "" for any
// other error or a daemon that names none.
func reasonOf(err error) (wire.Reason, bool) {
	var api *client.APIError
	if !errors.As(err, &api) || api.Status != 409 || api.Code != wire.CodeInvalid {
		return "", false
	}
	return api.Reason, true
}

// spawnConflictHint is the advice for a refused spawn or exec of req in
// sandbox name; "" when err is no conflict.
func (e *env) spawnConflictHint(ctx context.Context, c *client.Client, err error, name string, req wire.CreateSession) string {
	reason, ok := reasonOf(err)
	if !ok {
		return ""
	}
	switch reason {
	case wire.ReasonSandboxSuspended:
		return fmt.Sprintf("sandbox %s is suspended: runner resume %s, then run the command again", name, name)
	case wire.ReasonSessionExists:
		cctx, cancel := e.callCtx(ctx)
		s, serr := c.Session(cctx, name, req.ID)
		cancel()
		if serr != nil {
			return fmt.Sprintf("session %s exists with another request: runner sessions %s %s shows it, or pick another --id", req.ID, name, req.ID)
		}
		if s.State != wire.SessionRunning {
			// Attaching to an ended session only replays it: say how to
			// run the command again under that id.
			return fmt.Sprintf("session %s %s, with %s: runner logs %s %s shows its output; runner rm-session %s %s frees the id, or pick another --id",
				req.ID, endedText(s), sessionDiff(s, req, "ran"), name, req.ID, name, req.ID)
		}
		return fmt.Sprintf("session %s exists with %s: runner attach %s %s, or pick another --id",
			req.ID, sessionDiff(s, req, "runs"), name, req.ID)
	}
	return fmt.Sprintf("the request conflicts with the state of sandbox %s: runner get %s; runner sessions %s", name, name, name)
}

// endedText is how session s ended, for a person: "ended (exit code 3)",
// or "ended" while its exit is not known.
func endedText(s wire.Session) string {
	if s.Exit == nil {
		return "ended"
	}
	code, _ := exitOf("", *s.Exit, "")
	return fmt.Sprintf("ended (exit code %d)", code)
}

// sessionDiff says how session s differs from req: "another command (it
// runs [a b], this asks [c])" (verb: "runs" or "ran"), a terminal, or
// what the daemon keeps but does not show.
func sessionDiff(s wire.Session, req wire.CreateSession, verb string) string {
	var d []string
	if !slices.Equal(s.Argv, req.Argv) {
		d = append(d, fmt.Sprintf("another command (it %s %s, this asks %s)", verb, quoteArgv(s.Argv), quoteArgv(req.Argv)))
	}
	if s.TTY != req.TTY {
		if s.TTY {
			d = append(d, "a terminal (it was started with a TTY, this asks for pipes: add -t)")
		} else {
			d = append(d, "pipes (it was started without a TTY, this asks for one: -t=false)")
		}
	}
	if len(d) == 0 {
		return "the same command but another environment, working directory, terminal size or stdout/stderr merge"
	}
	return strings.Join(d, " and ")
}

// quoteArgv is argv as a person would type it.
func quoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`|&;<>()*?[]#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// createConflictHint is the advice for a create of name refused because
// the sandbox exists otherwise: runner's commands, not API paths.
func createConflictHint(err error, name string) string {
	if reason, ok := reasonOf(err); !ok || reason != wire.ReasonSandboxExists {
		return ""
	}
	return fmt.Sprintf("sandbox %s exists with other settings: runner get %s shows them; runner policy %s HOST... (or --deny-all) changes its network policy, runner limits %s --memory ... its limits; or create another NAME", name, name, name, name)
}

// execExistingNote tells the person that exec --id (or run --id) met
// session s already there with the same request: its output is shown,
// but the command does not run again (an id runs at most once).
func execExistingNote(e *env, name string, s wire.Session) {
	var msg string
	if s.State == wire.SessionRunning {
		msg = fmt.Sprintf("session %s already runs this command: following it (not started again)", s.ID)
	} else {
		msg = fmt.Sprintf("session %s already %s: replaying its output, not running the command again (runner rm-session %s %s, or another --id, runs it afresh)",
			s.ID, endedText(s), name, s.ID)
	}
	if e.g.json {
		writeJSONWarning(e, msg)
		return
	}
	fmt.Fprintf(e.io.err, "runner: note: %s\n", msg)
}
