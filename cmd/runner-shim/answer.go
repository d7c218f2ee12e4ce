package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/version"
	"github.com/agentrunner/runner/wire"
)

// answerer writes a subcommand's one answer, human or JSON, and returns
// its exit status.
type answerer struct {
	cmd  string
	json *bool
}

// ok answers success: text for humans, fields (plus "version") as one
// JSON line with --json.
func (a *answerer) ok(text string, fields map[string]any) int {
	if *a.json {
		a.emit(fields)
	} else {
		fmt.Print(text)
	}
	return wire.ShimExitOK
}

func (a *answerer) version() int {
	return a.ok(version.String()+"\n", map[string]any{})
}

// usage reports a usage error; with --json also as an invalid answer.
func (a *answerer) usage(detail string) {
	fmt.Fprintf(os.Stderr, "runner-shim %s: %s\n", a.cmd, detail)
	if *a.json {
		a.emit(map[string]any{"error": wire.Error{Code: wire.CodeInvalid, Detail: detail}})
	}
}

// fail answers err and returns its exit status (classify).
func (a *answerer) fail(err error) int {
	we, status := classify(err)
	fmt.Fprintf(os.Stderr, "runner-shim %s: %v\n", a.cmd, err)
	if *a.json {
		a.emit(map[string]any{"error": answerError{Error: we, ExecError: execErrorOf(status)}})
	}
	return status
}

// answerError is a --json error: the wire error, and for a command that
// could not be started "exec_error" ("not_found", "not_executable"), the
// refinement of invalid runnerd's answers carry under the same name.
type answerError struct {
	wire.Error
	ExecError string `json:"exec_error,omitempty"`
}

// execErrorOf is the exec_error of a start failure's exit status.
func execErrorOf(status int) string {
	switch status {
	case wire.ShimExitExecNotFound:
		return "not_found"
	case wire.ShimExitExecNotExecutable:
		return "not_executable"
	}
	return ""
}

func (a *answerer) emit(fields map[string]any) {
	fields["version"] = version.String()
	b, err := json.Marshal(fields)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"version": version.String(), "error": wire.Error{Code: wire.CodeProvider, Detail: err.Error()}})
	}
	os.Stdout.Write(append(b, '\n'))
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
