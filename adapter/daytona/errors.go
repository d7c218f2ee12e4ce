package daytona

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/secret"
)

// provider names this adapter in *adapter.ProviderError.
const provider = "daytona"

// ErrNameTaken is matched (errors.Is) by the error of [Client.Create] when
// the API answered 409: a sandbox with that name exists (possibly one this
// caller created before a lost answer). Its taxonomy kind is invalid; the
// layer above adopts the sandbox by getting it by name.
var ErrNameTaken = errors.New("sandbox name taken")

// Error is the detail of a failed call, beneath its taxonomy kind:
// errors.Is and errors.As on it reach the adapter error (for example
// *adapter.RateLimitedError) through Unwrap. Status lets the layer above
// tell answers apart that share a kind (a toolbox session the daemon does
// not know, 404, from another provider failure) without matching text.
type Error struct {
	// Op is the call that failed, as a short verb phrase ("get sandbox x").
	Op string
	// Status is the HTTP status of the answer, 0 when none arrived.
	Status int
	// OwnBody is true when the answer carried the API's or the toolbox
	// daemon's own error body (not a proxy's).
	OwnBody bool
	// DaemonStatus is, for an answer the toolbox daemon gave (its JSON
	// error body, or the empty body of gin's AbortWithError on a 400 or
	// 404), the status its answer means: Status, or the status the
	// message's common-go prefix names when the daemon wrapped a typed
	// error into a 500 ("failed to execute command: not found: session
	// not found" means 404). 0 for every other answer.
	DaemonStatus int
	// Message is the provider's message with every secret removed.
	Message string
	kind    error
	// taken marks a 409 on create (ErrNameTaken).
	taken bool
}

func (e *Error) Error() string { return e.Op + ": " + e.kind.Error() }

// Unwrap returns the taxonomy error and, for a 409 on create, ErrNameTaken.
func (e *Error) Unwrap() []error {
	if e.taken {
		return []error{e.kind, ErrNameTaken}
	}
	return []error{e.kind}
}

// IsToolboxNotFound reports whether err is the toolbox daemon's own "not
// found": no such session or command (a 404, or the 500 an exec answers
// for an unknown session), or no such file (a 404 with an empty body). It
// says nothing about the sandbox, so its taxonomy kind is provider (a
// session or command) or invalid (a file the caller named), never
// not_found.
func IsToolboxNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.DaemonStatus == http.StatusNotFound && strings.HasPrefix(e.Op, "toolbox ")
}

// IsSessionExists reports whether err is the toolbox daemon's 409 on
// session create: the session id is taken (the caller may have created it
// before a lost answer).
func IsSessionExists(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.DaemonStatus == http.StatusConflict && strings.HasPrefix(e.Op, "toolbox create session")
}

// isDaemonAnswer reports whether err is an answer of the toolbox daemon
// itself (not a proxy's, not a transport failure): the daemon refused or
// failed the call after reading it.
func isDaemonAnswer(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.DaemonStatus != 0
}

// op says which call failed: a GET of a sandbox may turn a 404 into
// adapter.ErrNotFound (the documented definitive answer), a create turns
// 409 into ErrNameTaken, and a toolbox call reads the daemon's codes.
type op int

const (
	opOther op = iota
	opGetSandbox
	opCreate
	opToolbox
	// opToolboxFile is a toolbox files call: its 404 is a path the caller
	// named that is not there (invalid), not a session the daemon lost.
	opToolboxFile
)

// errorBody is the error body of the API (NestJS: {statusCode, message,
// error}) and of the toolbox daemon (common-go: {statusCode, message,
// code, ...}). message may be a string or, for validation errors, a list.
type errorBody struct {
	StatusCode *int            `json:"statusCode"`
	Message    json.RawMessage `json:"message"`
}

// text returns the body's message as one string.
func (b errorBody) text() string {
	var s string
	if json.Unmarshal(b.Message, &s) == nil {
		return s
	}
	var l []string
	if json.Unmarshal(b.Message, &l) == nil {
		return strings.Join(l, "; ")
	}
	return ""
}

// parseErrorBody reports whether raw is the provider's own error body for
// an answer of this status: a proxy or load balancer in front answers with
// another shape (or with the same shape and another status: never trusted).
func parseErrorBody(raw []byte, status int) (string, bool) {
	var b errorBody
	if json.Unmarshal(raw, &b) != nil || b.StatusCode == nil || *b.StatusCode != status || len(b.Message) == 0 {
		return "", false
	}
	return b.text(), true
}

// ginNotFound is the body gin answers for a route it does not have.
const ginNotFound = "404 page not found"

// commonGoPrefixes are the prefixes the toolbox daemon's typed errors
// (daytonaio/common-go pkg/errors: NewNotFoundError, ...) put in front of
// their message, and the status each one is answered with when it reaches
// the error middleware unwrapped. A handler that wraps one (the session
// exec handler's fmt.Errorf("failed to execute command: %w")) turns it into
// a 500 whose message still carries the prefix: the only place the
// daemon's classification survives, so it is read from there.
var commonGoPrefixes = map[string]int{
	"not found":            http.StatusNotFound,
	"conflict":             http.StatusConflict,
	"gone":                 http.StatusGone,
	"bad request":          http.StatusBadRequest,
	"invalid body request": http.StatusBadRequest,
	"unauthorized":         http.StatusUnauthorized,
	"forbidden":            http.StatusForbidden,
	"request timeout":      http.StatusRequestTimeout,
	"unprocessable entity": http.StatusUnprocessableEntity,
}

// prefixStatus returns the status named by the first common-go prefix in
// a wrapped message ("failed to execute command: not found: ..."), 0 when
// it has none.
func prefixStatus(msg string) int {
	for _, part := range strings.Split(msg, ": ") {
		if st, ok := commonGoPrefixes[part]; ok {
			return st
		}
	}
	return 0
}

// daemonStatus judges a toolbox answer: the status it means when the
// toolbox daemon gave it, 0 when it did not (a proxy, a load balancer).
func daemonStatus(status int, raw []byte, own bool, msg string) int {
	switch {
	case own && status == http.StatusInternalServerError:
		if st := prefixStatus(msg); st != 0 {
			return st
		}
		return status
	case own:
		return status
	case len(raw) == 0 && (status == http.StatusBadRequest || status == http.StatusNotFound):
		// gin's AbortWithError writes the status and no body: the
		// daemon's upload, download and exec-binding failures.
		return status
	}
	return 0
}

// statusError maps an answer that is not a success.
func statusError(opName string, kind op, status int, h http.Header, raw []byte, red redactor) error {
	msg, own := parseErrorBody(raw, status)
	e := &Error{Op: opName, Status: status, OwnBody: own, Message: red.clean(msg)}
	toolbox := kind == opToolbox || kind == opToolboxFile
	eff := status
	if toolbox {
		e.DaemonStatus = daemonStatus(status, raw, own, msg)
		if e.DaemonStatus != 0 {
			eff, own = e.DaemonStatus, true
		}
	}
	detail := fmt.Sprintf("HTTP %d", status)
	if e.Message != "" {
		detail += ": " + e.Message
	}
	switch {
	case status == http.StatusTooManyRequests:
		e.kind = &adapter.RateLimitedError{RetryAfter: hosted.RetryAfter(h)}
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.kind = &adapter.DeniedError{Detail: detail}
	case toolbox && !own && status == http.StatusNotFound && strings.TrimSpace(string(raw)) == ginNotFound:
		// gin's answer for a route the daemon does not have (an older
		// or newer daemon, a wrong URL): asking again gets the same.
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail + ": the toolbox has no such route"}
	case !own:
		// A proxy's answer (the toolbox proxy gives 502 for a sandbox it
		// cannot reach), a 404 from a wrong URL, a 5xx page: it proves
		// nothing about the sandbox.
		e.kind = &adapter.UnavailableError{Detail: detail}
	case eff == http.StatusNotFound && kind == opGetSandbox:
		e.kind = adapter.ErrNotFound
	case eff == http.StatusNotFound && kind == opToolboxFile:
		// A path the caller named is not there.
		e.kind = &adapter.InvalidError{Detail: detail}
	case eff == http.StatusConflict && kind == opCreate:
		e.kind = &adapter.InvalidError{Detail: detail}
		e.taken = true
	case eff == http.StatusGone && toolbox:
		// Input to a command that already completed.
		e.kind = adapter.ErrCommandExited
	case eff == http.StatusUnauthorized || eff == http.StatusForbidden:
		e.kind = &adapter.DeniedError{Detail: detail}
	case eff == http.StatusBadRequest || eff == http.StatusConflict || eff == http.StatusUnprocessableEntity:
		e.kind = &adapter.InvalidError{Detail: detail}
	case eff == http.StatusRequestTimeout || eff == http.StatusServiceUnavailable || eff == http.StatusBadGateway || eff == http.StatusGatewayTimeout:
		e.kind = &adapter.UnavailableError{Detail: detail}
	default:
		// 404 of anything but GET sandbox (delete, stop, a toolbox session:
		// confirm with Get), 500 with the provider's body, other codes.
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail}
	}
	return e
}

// transportError maps a failure with no HTTP answer (refused, reset,
// timeout, a body cut short). The caller's own context ending wins: the
// result is then the context error, not a provider kind.
func transportError(ctx context.Context, opName string, err error, red redactor) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", opName, ctxErr)
	}
	return &Error{Op: opName, kind: &adapter.UnavailableError{Detail: red.clean(err.Error())}}
}

// redactor removes the secrets it knows from text that came from outside
// (server messages, transport errors that quote a URL) before it enters an
// error.
type redactor []Secret

func (r redactor) clean(s string) string { return secret.Redact(s, r...) }

func invalid(detail string) error     { return &adapter.InvalidError{Detail: detail} }
func unavailable(detail string) error { return &adapter.UnavailableError{Detail: detail} }
