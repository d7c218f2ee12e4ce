package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/agentrunner/runner/adapter/guest/guestproto"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/version"
	"github.com/agentrunner/runner/wire"
)

// answerer writes a subcommand's one answer, human or JSON, and returns
// its exit status.
type answerer struct {
	cmd  string
	json *bool
}

// reply is runner-shim's --json answer (the in-guest protocol, read by
// adapter/guest), over its own session object.
type reply = guestproto.Answer[sessiondir.Info]

// ok answers success: text for humans, ans (plus its version) as one JSON
// line with --json.
func (a *answerer) ok(text string, ans reply) int {
	if *a.json {
		a.emit(ans)
	} else {
		fmt.Print(text)
	}
	return wire.ShimExitOK
}

func (a *answerer) version() int {
	return a.ok(version.String()+"\n", reply{})
}

// usage reports a usage error; with --json also as an invalid answer.
func (a *answerer) usage(detail string) {
	fmt.Fprintf(os.Stderr, "runner-shim %s: %s\n", a.cmd, detail)
	if *a.json {
		a.emit(reply{Error: &guestproto.Error{Error: wire.Error{Code: wire.CodeInvalid, Detail: detail}}})
	}
}

// fail answers err and returns its exit status (classify).
func (a *answerer) fail(err error) int {
	we, status := classify(err)
	fmt.Fprintf(os.Stderr, "runner-shim %s: %v\n", a.cmd, err)
	if *a.json {
		a.emit(reply{Error: &guestproto.Error{Error: we, ExecError: execErrorOf(status)}})
	}
	return status
}

// execErrorOf is the exec_error of a start failure's exit status: the
// refinement of invalid runnerd's answers carry under the same name.
func execErrorOf(status int) string {
	switch status {
	case wire.ShimExitExecNotFound:
		return guestproto.ExecNotFound
	case wire.ShimExitExecNotExecutable:
		return guestproto.ExecNotExecutable
	}
	return ""
}

func (a *answerer) emit(ans reply) {
	os.Stdout.Write(answerLine(ans))
}

// answerLine is ans with runner-shim's version as one JSON line.
func answerLine(ans reply) []byte {
	ans.Version = version.String()
	b, err := json.Marshal(ans)
	if err != nil {
		b, _ = json.Marshal(reply{Version: version.String(), Error: &guestproto.Error{Error: wire.Error{Code: wire.CodeProvider, Detail: err.Error()}}})
	}
	return append(b, '\n')
}

// classify is the one mapping of runner-shim's failures to the contract's
// codes and runner-shim's exit statuses (wire.ErrorTable's ShimExit),
// with runnerd's rules: a start failure of the command's own program is
// invalid (exit 127/126 as a shell says it), any other start failure is
// unavailable; an existing id with another request is invalid with
// wire.DetailConflict (exit 7).
func classify(err error) (wire.Error, int) {
	var se *launch.StartError
	switch {
	case errors.Is(err, errConflict):
		return wire.Error{Code: wire.CodeInvalid, Detail: wire.DetailConflict + ": " + err.Error()}, wire.ShimExitConflict
	case errors.As(err, &se):
		if status, ok := execStatus(err); ok {
			return wire.Error{Code: wire.CodeInvalid, Detail: err.Error()}, status
		}
		return wire.Error{Code: wire.CodeUnavailable, Detail: err.Error()}, wire.ShimExitUnavailable
	}
	code := launch.CodeOf(err)
	status := wire.ShimExitFailure
	if row, ok := wire.RowOf(code); ok {
		status = row.ShimExit
	}
	return wire.Error{Code: code, Detail: err.Error()}, status
}

func indent(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b) + "\n"
}

func compact(v any) string {
	b, _ := json.Marshal(v)
	return string(b) + "\n"
}
