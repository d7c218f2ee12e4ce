package sprites

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/secret"
)

// provider names this client in *adapter.ProviderError.
const provider = "sprites"

// notFoundError is the "error" field of the API's answer to GET of a sprite
// that does not exist (and to DELETE of one). It is the API's verdict, a
// protocol constant like an error code; a 404 of any other shape (a proxy,
// a wrong route) proves nothing about the sprite.
const notFoundError = "sprite not found"

var (
	// ErrCreateConflict is returned by [Client.Create] when the API refused
	// the create with 409, or with 400 (the API answers a name that already
	// exists with either). The name may be taken: Get it, and adopt the
	// sprite if it exists; if Get says not found, the create was invalid.
	// Its taxonomy kind is invalid.
	ErrCreateConflict = errors.New("create refused: the name may already exist")

	// ErrNoExit is returned by [Session.Recv] (and [Client.Run]) when the
	// exec WebSocket closed before an exit frame arrived. Sprites closes
	// about 30 % of fast commands with status 1000 and no exit frame: the
	// command's exit is unknown, never 0. Its taxonomy kind is unavailable,
	// with Uncertain set.
	ErrNoExit = errors.New("exec ended without an exit frame")

	// ErrNoCheckpoint is wrapped when the API answers 404 for a
	// checkpoint id of a sprite that exists (kind invalid, never
	// not_found: that speaks only of the sprite).
	ErrNoCheckpoint = errors.New("no such checkpoint")

	// ErrWriteDenied is wrapped by [Client.WriteFile] when the API
	// answers 403: fs/write has no asRoot flag and writes as the sprite
	// user, who may not write the path (kind provider, never denied).
	ErrWriteDenied = errors.New("fs/write may not write the path")

	// ErrNoFile is returned by [Client.ReadFile] when the API answered 404
	// with its own error body: no such file (or no such sprite; Get tells
	// them apart). Its taxonomy kind is provider.
	ErrNoFile = errors.New("no such file")

	// ErrNoSession is returned by [Client.Kill] when the API answered 404
	// with its own error body: no such exec session (or no such sprite; Get
	// tells them apart). Its taxonomy kind is provider.
	ErrNoSession = errors.New("no such exec session")
)

// Error is the detail of a failed call, beneath its taxonomy kind: errors.Is
// and errors.As reach the adapter error (for example
// *adapter.RateLimitedError) and this package's sentinels through Unwrap.
type Error struct {
	// Op is the call that failed, as a short verb phrase ("get sprite x").
	Op string
	// Status is the HTTP status of the answer, 0 when none arrived.
	Status int
	// Code is the API's machine-readable "error" field, when it sent one.
	Code string
	// Message is the API's message with every secret removed.
	Message string
	kind    error
	cause   error // a sentinel of this package, or nil
}

func (e *Error) Error() string {
	if e.cause != nil {
		return e.Op + ": " + e.cause.Error() + ": " + e.kind.Error()
	}
	return e.Op + ": " + e.kind.Error()
}

// Unwrap returns the taxonomy error and, when set, this package's sentinel.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// apiOp says which call failed: only a GET of a sprite may turn a 404 into
// adapter.ErrNotFound (the documented definitive answer).
type apiOp int

const (
	opOther apiOp = iota
	opGetSprite
	opCreate
	opDelete
	opReadFile
	opWriteFile
	opCheckpoint
)

// parseErrorBody decodes an error answer's body; ok is false when it is
// not the API's {error, message} (a proxy's page, nothing at all).
func parseErrorBody(raw []byte) (eb apiErrorBody, ok bool) {
	ok = json.Unmarshal(raw, &eb) == nil && (eb.Error != "" || eb.Message != "")
	return eb, ok
}

// apiErrorBody is the API's error answer (sprites-go errors.go: APIError).
type apiErrorBody struct {
	Error             string `json:"error"`
	Message           string `json:"message"`
	RetryAfterSeconds int    `json:"retry_after_seconds"`
}

// apiStatusError maps an answer that is not a success. hasBody says the
// body parsed as the API's error object; a 404 without it is a proxy or a
// wrong URL, not the API's verdict.
func apiStatusError(op string, kind apiOp, status int, h http.Header, body apiErrorBody, hasBody bool, red redactor) error {
	e := &Error{Op: op, Status: status}
	if hasBody {
		e.Code = red.clean(body.Error)
		e.Message = red.clean(body.Message)
	}
	detail := fmt.Sprintf("HTTP %d", status)
	if e.Code != "" {
		detail += " " + e.Code
	}
	if e.Message != "" {
		detail += ": " + e.Message
	}
	apiNotFound := status == http.StatusNotFound && hasBody && body.Error == notFoundError
	switch {
	case apiNotFound && kind == opGetSprite:
		e.kind = adapter.ErrNotFound
	case status == http.StatusNotFound && hasBody && kind == opReadFile:
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail}
		e.cause = ErrNoFile
	case status == http.StatusNotFound && hasBody && !apiNotFound && kind == opCheckpoint:
		// The sprite answered; the checkpoint is not one of its own.
		e.kind = &adapter.InvalidError{Detail: detail}
		e.cause = ErrNoCheckpoint
	case apiNotFound:
		// The API said so, but the contract reserves not_found for GET of
		// the sprite; the caller confirms with Get.
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail}
	case status == http.StatusTooManyRequests:
		d := hosted.RetryAfter(h)
		if d == 0 && hasBody && body.RetryAfterSeconds > 0 {
			d = time.Duration(body.RetryAfterSeconds) * time.Second
		}
		e.kind = &adapter.RateLimitedError{RetryAfter: d}
	case status == http.StatusForbidden && kind == opWriteFile:
		// fs/write runs as the sprite user: a 403 is a path that user may
		// not write, not a bad token (which is 401 everywhere).
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail + " (fs/write runs as the sprite user)"}
		e.cause = ErrWriteDenied
	case status == http.StatusRequestEntityTooLarge:
		e.kind = &adapter.InvalidError{Detail: detail}
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.kind = &adapter.DeniedError{Detail: detail}
	case (status == http.StatusBadRequest || status == http.StatusConflict) && kind == opCreate:
		e.kind = &adapter.InvalidError{Detail: detail}
		e.cause = ErrCreateConflict
	case status == http.StatusBadRequest || status == http.StatusConflict || status == http.StatusUnprocessableEntity:
		e.kind = &adapter.InvalidError{Detail: detail}
	case status >= 500, status == http.StatusNotFound, status == http.StatusRequestTimeout:
		// A 502 from Fly's proxy, a 503 in an outage, a 404 that is not the
		// API's body: nothing is proven about the sprite.
		e.kind = &adapter.UnavailableError{Detail: detail}
	default:
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail}
	}
	return e
}

// transportError maps a failure with no HTTP answer (refused, reset,
// timeout, a body cut short). The caller's own context ending wins. The
// detail never quotes the request URL: *url.Error's text does, and an exec
// URL carries the argv and the environment.
func transportError(ctx context.Context, op string, err error, uncertain bool, red redactor) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", op, ctxErr)
	}
	return &Error{Op: op, kind: &adapter.UnavailableError{Detail: red.clean(urlFree(err)), Uncertain: uncertain}}
}

// urlFree renders err without the URL a *url.Error (or a wrapper quoting
// it) would print.
func urlFree(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}

// redactor removes the secrets and URLs it knows from text that came from
// outside (server messages, transport errors) before it enters an error.
type redactor struct {
	secrets []Secret
	plain   []string // request URLs and the like: removed verbatim
}

func (r redactor) clean(s string) string {
	for _, p := range r.plain {
		if p != "" {
			s = strings.ReplaceAll(s, p, "[request]")
		}
	}
	return secret.Redact(s, r.secrets...)
}

func invalid(detail string) error     { return &adapter.InvalidError{Detail: detail} }
func unavailable(detail string) error { return &adapter.UnavailableError{Detail: detail} }

// asError is errors.As for *Error (nil-safe).
func asError(err error, target **Error) bool {
	if err == nil {
		return false
	}
	return errors.As(err, target)
}
