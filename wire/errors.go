package wire

import (
	"fmt"
	"net/http"
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
	// CodeProvider: anything else the daemon could not classify.
	CodeProvider Code = "provider"
)

// Codes lists every code, in the order of the taxonomy.
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

// Details that carry meaning beyond prose. A client may match these exact
// strings in Error.Detail together with the code.
const (
	// DetailNoRoute accompanies 404 invalid for a path runnerd does not serve.
	DetailNoRoute = "no such route"
	// DetailConflict accompanies 409 invalid when a session ID is reused with
	// a different request.
	DetailConflict = "conflict"
	// DetailUncertain accompanies unavailable when a terminate could not
	// confirm how the session ended.
	DetailUncertain = "uncertain"
)

// Error is a runnerd error as it crosses the wire, and a Go error.
type Error struct {
	Code         Code   `json:"code"`
	Detail       string `json:"detail,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
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
