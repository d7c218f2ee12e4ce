package wire

import (
	"fmt"
	"net/http"
	"strings"
)

// Code is one error code of the contract's closed taxonomy, as it crosses
// the wire in the Runner-Error header and the error body.
type Code string

// The error codes. Only NotFound with the Runner-Error header present is a
// definitive answer about absence; every other code, and every response
// without the header, says nothing about whether a sandbox exists.
const (
	// CodeNotFound: the registry definitively has no such sandbox or session.
	CodeNotFound Code = "not_found"
	// CodeTruncated: a cursor is behind the retained data.
	CodeTruncated Code = "truncated"
	// CodeNotSupported: this host does not deliver the capability.
	CodeNotSupported Code = "not_supported"
	// CodeCommandExited: a stdin write or close reached a command that ended.
	CodeCommandExited Code = "command_exited"
	// CodeRateLimited: try again after RetryAfterMS.
	CodeRateLimited Code = "rate_limited"
	// CodeUnavailable: transient; the outcome of the call is unknown or it
	// did not happen. Retry idempotent calls.
	CodeUnavailable Code = "unavailable"
	// CodeDenied: missing or wrong credential, or not permitted.
	CodeDenied Code = "denied"
	// CodeInvalid: the request is malformed, conflicts with state, or names
	// no route. Retrying it unchanged gives the same answer.
	CodeInvalid Code = "invalid"
	// CodeRestoreFailed: a resume could not restore the sandbox.
	CodeRestoreFailed Code = "restore_failed"
	// CodeWriteFailed: the session's journal could not be written.
	CodeWriteFailed Code = "write_failed"
	// CodeProvider: the daemon or the shim failed in a way no other code
	// describes (a signal or resize the kernel refused, an unexpected
	// internal failure). It is not transient.
	CodeProvider Code = "provider"
	// CodeLost: the session ended without an exit record. It never heads
	// an HTTP error response (a stream says it with a lost frame, a
	// terminate with an exit whose reason is lost), so it is not in Codes;
	// it is in ErrorTable because it is a kind with its own exit status.
	CodeLost Code = "lost"
)

// Codes lists every code an error response (the Runner-Error header, an
// error body, an error frame) can carry, in the order of the taxonomy.
var Codes = []Code{
	CodeNotFound, CodeTruncated, CodeNotSupported, CodeCommandExited,
	CodeRateLimited, CodeUnavailable, CodeDenied, CodeInvalid,
	CodeRestoreFailed, CodeWriteFailed, CodeProvider,
}

// Known reports whether c is one of Codes.
func (c Code) Known() bool {
	for _, k := range Codes {
		if c == k {
			return true
		}
	}
	return false
}

// ErrorRow is one row of ErrorTable: everything each side of the system
// decides about one error code.
type ErrorRow struct {
	// Code is the wire code. The adapter taxonomy's kind for it has the
	// same name (adapter.Kind(Code)); adapter/stream converts.
	Code Code
	// Status is the HTTP status runnerd answers this code with, unless
	// one of Statuses fits the case better. 0 means never an HTTP answer.
	Status int
	// Statuses lists every HTTP status runnerd may send with this code,
	// Status first.
	Statuses []int
	// Transient reports whether a call that failed with this code is
	// worth retrying unchanged (adapter.Transient agrees).
	Transient bool
	// Exit is runner's (the CLI's) exit status for a failure of this kind.
	Exit int
	// ShimExit is runner-shim's exit status for a failure of this kind.
	ShimExit int
}

// ErrorTable is the one error table: code, HTTP status, transience, CLI
// exit status and runner-shim exit status, for every code of the taxonomy
// (Codes, then CodeLost). runnerd takes its statuses from here, the client
// and adapter/stream their kinds, cmd/runner and cmd/runner-shim their exit
// statuses; TestErrorTable walks every row through every mapping.
var ErrorTable = []ErrorRow{
	{Code: CodeNotFound, Status: 404, Statuses: []int{404}, Exit: RunnerExitNotFound, ShimExit: ShimExitNotFound},
	{Code: CodeTruncated, Status: 416, Statuses: []int{416}, Exit: RunnerExitTruncated, ShimExit: ShimExitTruncated},
	{Code: CodeNotSupported, Status: 501, Statuses: []int{501}, Exit: RunnerExitNotSupported, ShimExit: ShimExitFailure},
	{Code: CodeCommandExited, Status: 409, Statuses: []int{409}, Exit: RunnerExitCommandExited, ShimExit: ShimExitCommandExited},
	{Code: CodeRateLimited, Status: 429, Statuses: []int{429}, Transient: true, Exit: RunnerExitRateLimited, ShimExit: ShimExitFailure},
	{Code: CodeUnavailable, Status: 503, Statuses: []int{503}, Transient: true, Exit: RunnerExitUnavailable, ShimExit: ShimExitUnavailable},
	{Code: CodeDenied, Status: 401, Statuses: []int{401, 403}, Exit: RunnerExitDenied, ShimExit: ShimExitFailure},
	{Code: CodeInvalid, Status: 400, Statuses: []int{400, 404, 405, 409, 413}, Exit: RunnerExitInvalid, ShimExit: ShimExitInvalid},
	{Code: CodeRestoreFailed, Status: 500, Statuses: []int{500}, Exit: RunnerExitOther, ShimExit: ShimExitFailure},
	{Code: CodeWriteFailed, Status: 507, Statuses: []int{507}, Exit: RunnerExitOther, ShimExit: ShimExitFailure},
	{Code: CodeProvider, Status: 500, Statuses: []int{500}, Exit: RunnerExitOther, ShimExit: ShimExitFailure},
	{Code: CodeLost, Status: 0, Exit: RunnerExitLost, ShimExit: ShimExitLost},
}

// RowOf returns c's row of ErrorTable, and false for a code outside it.
func RowOf(c Code) (ErrorRow, bool) {
	for _, r := range ErrorTable {
		if r.Code == c {
			return r, true
		}
	}
	return ErrorRow{}, false
}

// Status returns the HTTP status runnerd answers c with by default, and
// 500 for a code outside ErrorTable or one that is never an HTTP answer.
func (c Code) Status() int {
	if r, ok := RowOf(c); ok && r.Status != 0 {
		return r.Status
	}
	return http.StatusInternalServerError
}

// Details that carry meaning beyond prose. A client may match these exact
// strings in Error.Detail together with the code.
const (
	// DetailNoRoute accompanies 404 invalid for a path runnerd does not serve.
	DetailNoRoute = "no such route"
	// DetailConflict accompanies 409 invalid when a session ID is reused with
	// a different request.
	DetailConflict = "conflict"
	// DetailSessionCap starts the detail of 409 invalid for a session
	// create (or exec) refused because its sandbox runs as many sessions
	// as runnerd allows one sandbox (--sandbox-max-sessions): sessions
	// whose supervisor lives, running or ended with processes left. One
	// ending (or terminated) frees room; ended sessions do not count.
	DetailSessionCap = "session_cap"
	// DetailJournalCap starts the detail of 409 invalid for a session
	// create refused because its sandbox's journals hold as many bytes as
	// runnerd allows one sandbox (--sandbox-journal-bytes).
	DetailJournalCap = "journal_cap"
	// DetailUncertain starts the detail of an unavailable answer whose
	// outcome runnerd could not confirm (a terminate, a start, an exec
	// whose end is unknown). Error.Uncertain says the same as a field;
	// daemons before that field sent only this prefix, so a client reads
	// either (see IsUncertain).
	DetailUncertain = "uncertain"
)

// Error is a runnerd error as it crosses the wire, and a Go error.
type Error struct {
	Code         Code   `json:"code"`
	Detail       string `json:"detail,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	// Uncertain is set with CodeUnavailable when the call may or may not
	// have taken effect (a terminate that could not confirm the end, a
	// start that may be running): retry with the same id, never assume.
	Uncertain bool `json:"uncertain,omitempty"`
	// ExecError is set with CodeInvalid when a spawn or exec failed
	// because the command itself could not be started: ExecErrorNotFound
	// or ExecErrorNotExecutable. It refines invalid for clients that
	// report the command's failure as a shell would (runner exits 127 and
	// 126); it is not a code of its own, so a client that ignores it still
	// sees invalid.
	ExecError ExecError `json:"exec_error,omitempty"`
	// Exhausted is set with CodeUnavailable (503) when the host takes no
	// more sandboxes or sessions (runnerd --max-sandboxes,
	// --max-sessions): nothing was created; another host may take it.
	Exhausted bool `json:"exhausted,omitempty"`
	// Reason says which conflict a 409 invalid is (Reason*), so that a
	// client can tell a suspended sandbox from a reused session id
	// without reading Detail. It refines invalid and is not a code of
	// its own: absent from daemons before it, and a client that does not
	// know a value sees invalid as before.
	Reason Reason `json:"reason,omitempty"`
}

// Reason says which state a request conflicted with (Error.Reason).
type Reason string

// The values of Error.Reason. More may be added; a client treats one it
// does not know as a plain conflict.
const (
	// ReasonSessionExists: a spawn or exec named a session id that
	// exists with a different request (argv, env, cwd, tty or its size,
	// merged stderr). Detail is DetailConflict's.
	ReasonSessionExists Reason = "session_exists"
	// ReasonSandboxExists: a create named a sandbox that exists with a
	// different user, network policy or limits.
	ReasonSandboxExists Reason = "sandbox_exists"
	// ReasonSandboxSuspended: a spawn or exec reached a suspended
	// sandbox; resume it first.
	ReasonSandboxSuspended Reason = "sandbox_suspended"
	// ReasonSessionRunning: a session delete reached a session that runs,
	// or whose processes outlived its command; terminate it first.
	ReasonSessionRunning Reason = "session_running"
)

// ExecError says why a command could not be started (Error.ExecError).
type ExecError string

// The values of Error.ExecError.
const (
	// ExecErrorNotFound: the command's executable does not exist (argv[0]
	// not on PATH, or a path that names nothing: ENOENT).
	ExecErrorNotFound ExecError = "not_found"
	// ExecErrorNotExecutable: the executable exists but cannot be run
	// (EACCES: no execute permission; EISDIR: a directory; ENOEXEC: not
	// an executable format).
	ExecErrorNotExecutable ExecError = "not_executable"
)

// IsUncertain reports whether e says its outcome is unknown: the
// Uncertain field, or (from a daemon that predates it) a detail that
// starts with DetailUncertain.
func (e *Error) IsUncertain() bool {
	if e.Uncertain {
		return true
	}
	return e.Detail == DetailUncertain || strings.HasPrefix(e.Detail, DetailUncertain+":")
}

// Error implements error.
func (e *Error) Error() string {
	if e.Detail == "" {
		return string(e.Code)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Detail)
}

// ErrorBody is the JSON body of every non-2xx response runnerd produces.
type ErrorBody struct {
	Error Error `json:"error"`
}

// IsDefinitiveAbsence reports whether an HTTP response with the given status
// and Runner-Error header value proves that the addressed sandbox or session
// does not exist. It is the one rule a client needs: 404 with header
// not_found. A 404 without the header (a proxy) or with code invalid (an
// unknown route) proves nothing.
func IsDefinitiveAbsence(status int, header string) bool {
	return status == http.StatusNotFound && Code(header) == CodeNotFound
}
