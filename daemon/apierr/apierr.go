// Package apierr is the error vocabulary runnerd's managers and its HTTP
// face share: an Error carries the status and wire code (the contract's
// closed taxonomy, wire.ErrorTable) a manager decided, so that a manager
// returns typed errors and never touches an http.ResponseWriter, and the
// HTTP face (package daemon, errors.go) is the one place that writes them.
//
// Invariants: it imports only the standard library and wire, so every
// package under daemon may use it; not_found is built only by a caller
// whose source of truth said so (NotFound), never inferred here.
package apierr

import (
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"time"

	"github.com/agentrunner/runner/wire"
)

// Error is an error with a decided status and wire code. Managers build
// them with the constructors below when they know the answer; anything
// else is classified by the HTTP face.
type Error struct {
	Status       int
	Code         wire.Code
	Detail       string
	RetryAfterMS int64
	Uncertain    bool // unavailable whose outcome is unknown (Uncertain)
	// ExecError refines invalid for a command that could not be started
	// (wire.Error.ExecError).
	ExecError wire.ExecError
	// Reason says which conflict a 409 is (wire.Error.Reason).
	Reason wire.Reason
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Detail) }

// Invalid is the caller's mistake: 400 invalid.
func Invalid(format string, args ...any) *Error {
	return &Error{Status: wire.CodeInvalid.Status(), Code: wire.CodeInvalid, Detail: fmt.Sprintf(format, args...)}
}

// Conflict is a request at odds with what exists: 409 invalid.
func Conflict(format string, args ...any) *Error {
	return &Error{Status: http.StatusConflict, Code: wire.CodeInvalid, Detail: fmt.Sprintf(format, args...)}
}

// ConflictFor is Conflict with the reason a client reads instead of the
// detail (wire.Error.Reason).
func ConflictFor(reason wire.Reason, format string, args ...any) *Error {
	ae := Conflict(format, args...)
	ae.Reason = reason
	return ae
}

// TooLarge is a body over limit bytes: 413 invalid.
func TooLarge(limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: wire.CodeInvalid,
		Detail: fmt.Sprintf("body larger than %d bytes", limit)}
}

// NotFound is absence the source of truth (the registry) answered for the
// exact thing addressed.
func NotFound(format string, args ...any) *Error {
	return &Error{Status: wire.CodeNotFound.Status(), Code: wire.CodeNotFound, Detail: fmt.Sprintf(format, args...)}
}

// NotSupported is a feature this runnerd does not deliver.
func NotSupported(format string, args ...any) *Error {
	return &Error{Status: wire.CodeNotSupported.Status(), Code: wire.CodeNotSupported, Detail: fmt.Sprintf(format, args...)}
}

// Unavailable is a transient failure (retry); an outcome runnerd could
// not confirm is Uncertain.
func Unavailable(format string, args ...any) *Error {
	return &Error{Status: wire.CodeUnavailable.Status(), Code: wire.CodeUnavailable, Detail: fmt.Sprintf(format, args...)}
}

// Uncertain is unavailable for a call whose outcome runnerd could not
// confirm: the body says uncertain, and its detail keeps the
// wire.DetailUncertain prefix that clients before the field read.
func Uncertain(format string, args ...any) *Error {
	return &Error{Status: wire.CodeUnavailable.Status(), Code: wire.CodeUnavailable, Uncertain: true,
		Detail: wire.DetailUncertain + ": " + fmt.Sprintf(format, args...)}
}

// CommandExited is an operation on a command that has exited.
func CommandExited() *Error {
	return &Error{Status: wire.CodeCommandExited.Status(), Code: wire.CodeCommandExited, Detail: "the command has exited"}
}

// Truncated is a read of output the journal no longer holds.
func Truncated(detail string) *Error {
	return &Error{Status: wire.CodeTruncated.Status(), Code: wire.CodeTruncated, Detail: detail}
}

// WriteFailed is a write that did not land.
func WriteFailed(format string, args ...any) *Error {
	return &Error{Status: wire.CodeWriteFailed.Status(), Code: wire.CodeWriteFailed, Detail: fmt.Sprintf(format, args...)}
}

// Provider is a failure of what runs commands (the shim).
func Provider(format string, args ...any) *Error {
	return &Error{Status: wire.CodeProvider.Status(), Code: wire.CodeProvider, Detail: fmt.Sprintf(format, args...)}
}

var (
	// Denied is a request without the right bearer token.
	Denied = &Error{Status: wire.CodeDenied.Status(), Code: wire.CodeDenied, Detail: "missing or wrong bearer token"}
	// NoRoute is a path runnerd does not serve.
	NoRoute = &Error{Status: http.StatusNotFound, Code: wire.CodeInvalid, Detail: wire.DetailNoRoute}
)

// noSpaceRetry is the wait a write_failed answer for a full disk asks for:
// space comes back when something is deleted, not at a known time.
const noSpaceRetry = 5 * time.Second

// IsNoSpace reports whether err is a file system out of blocks, inodes or
// quota.
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// NoSpace is the answer for what could not be written because the file
// system is full: 507 write_failed, retry_after_ms set.
func NoSpace(what string, err error) *Error {
	ae := WriteFailed("%s: %v", what, err)
	ae.RetryAfterMS = noSpaceRetry.Milliseconds()
	return ae
}

// RegistryWrite is the answer for a registry commit that failed: a full
// disk is write_failed (NoSpace), anything else unavailable.
func RegistryWrite(err error) *Error {
	if IsNoSpace(err) {
		return NoSpace("write registry", err)
	}
	return Unavailable("write registry: %v", err)
}
