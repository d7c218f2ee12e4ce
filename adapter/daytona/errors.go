package daytona

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
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

// IsToolboxNotFound reports whether err is the toolbox daemon's own 404: no
// such session or command (or file). It says nothing about the sandbox,
// so its taxonomy kind is provider, never not_found.
func IsToolboxNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound && e.OwnBody && strings.HasPrefix(e.Op, "toolbox ")
}

// IsSessionExists reports whether err is the toolbox daemon's 409 on
// session create: the session id is taken (the caller may have created it
// before a lost answer).
func IsSessionExists(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusConflict && e.OwnBody && strings.HasPrefix(e.Op, "toolbox create session")
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

// statusError maps an answer that is not a success.
func statusError(opName string, kind op, status int, h http.Header, raw []byte, red redactor) error {
	msg, own := parseErrorBody(raw, status)
	e := &Error{Op: opName, Status: status, OwnBody: own, Message: red.clean(msg)}
	detail := fmt.Sprintf("HTTP %d", status)
	if e.Message != "" {
		detail += ": " + e.Message
	}
	switch {
	case status == http.StatusTooManyRequests:
		e.kind = &adapter.RateLimitedError{RetryAfter: retryAfter(h)}
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.kind = &adapter.DeniedError{Detail: detail}
	case !own:
		// A proxy's answer (the toolbox proxy gives 502 for a sandbox it
		// cannot reach), a 404 from a wrong URL, a 5xx page: it proves
		// nothing about the sandbox.
		e.kind = &adapter.UnavailableError{Detail: detail}
	case status == http.StatusNotFound && kind == opGetSandbox:
		e.kind = adapter.ErrNotFound
	case status == http.StatusConflict && kind == opCreate:
		e.kind = &adapter.InvalidError{Detail: detail}
		e.taken = true
	case status == http.StatusGone && kind == opToolbox:
		// Input to a command that already completed.
		e.kind = adapter.ErrCommandExited
	case status == http.StatusBadRequest || status == http.StatusConflict || status == http.StatusUnprocessableEntity:
		e.kind = &adapter.InvalidError{Detail: detail}
	case status == http.StatusRequestTimeout || status == http.StatusServiceUnavailable || status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
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

// retryAfter reads Retry-After as seconds or as an HTTP date; zero when
// absent or unparsable.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// redactor removes the secrets it knows from text that came from outside
// (server messages, transport errors that quote a URL) before it enters an
// error.
type redactor []Secret

func (r redactor) clean(s string) string {
	for _, sec := range r {
		if v := sec.Reveal(); v != "" {
			s = strings.ReplaceAll(s, v, secret.Redacted)
		}
	}
	return s
}

func invalid(detail string) error     { return &adapter.InvalidError{Detail: detail} }
func unavailable(detail string) error { return &adapter.UnavailableError{Detail: detail} }
