package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted"
	"github.com/agentrunner/runner/adapter/secret"
)

// provider names this adapter in *adapter.ProviderError.
const provider = "e2b"

// Error is the detail of a failed call, beneath its taxonomy kind: errors.Is
// and errors.As on it reach the adapter error (for example
// *adapter.RateLimitedError) through Unwrap. Status and Code let the layer
// above tell answers apart that share a kind (a process envd does not know
// from another provider failure) without matching text.
type Error struct {
	// Op is the call that failed, as a short verb phrase ("get sandbox x").
	Op string
	// Status is the HTTP status of the answer, 0 when none arrived.
	Status int
	// Code is the Connect error code for envd ("not_found", "unknown") or
	// the control plane's numeric code as text; empty when the answer
	// carried no parsable error body.
	Code string
	// Message is the provider's message with every secret removed.
	Message string
	kind    error
}

func (e *Error) Error() string { return e.Op + ": " + e.kind.Error() }

// Unwrap returns the taxonomy error.
func (e *Error) Unwrap() error { return e.kind }

// The Connect protocol's error codes (connectrpc.com/docs/protocol, "Error
// Codes"), as they appear in envd's error bodies and end-stream messages.
const (
	CodeCanceled           = "canceled"
	CodeUnknown            = "unknown"
	CodeInvalidArgument    = "invalid_argument"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodePermissionDenied   = "permission_denied"
	CodeResourceExhausted  = "resource_exhausted"
	CodeFailedPrecondition = "failed_precondition"
	CodeAborted            = "aborted"
	CodeOutOfRange         = "out_of_range"
	CodeUnimplemented      = "unimplemented"
	CodeInternal           = "internal"
	CodeUnavailable        = "unavailable"
	CodeDataLoss           = "data_loss"
	CodeUnauthenticated    = "unauthenticated"
)

// IsProcessNotFound reports whether err is envd's own answer that no
// process matches the selector (Connect code not_found in envd's error
// body). It says nothing about the sandbox, so its taxonomy kind is
// provider, never not_found: the layer above decides what a vanished
// process means.
func IsProcessNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == CodeNotFound && strings.HasPrefix(e.Op, "envd ")
}

// apiOp says which control-plane call failed; only a GET of a sandbox may
// turn a 404 into adapter.ErrNotFound (the documented definitive answer).
type apiOp int

const (
	opOther apiOp = iota
	opGetSandbox
)

// apiErrorBody is the control plane's Error schema: {code, message}.
type apiErrorBody struct {
	Code    *int    `json:"code"`
	Message *string `json:"message"`
}

// apiStatusError maps a control-plane answer that is not a success.
// hasBody says the body parsed as E2B's Error schema; a 404 without it is a
// proxy or a wrong URL, not the API's verdict.
func apiStatusError(op string, kind apiOp, status int, h http.Header, body apiErrorBody, hasBody bool, red redactor) error {
	e := &Error{Op: op, Status: status}
	if hasBody {
		if body.Code != nil {
			e.Code = strconv.Itoa(*body.Code)
		}
		if body.Message != nil {
			e.Message = red.clean(*body.Message)
		}
	}
	detail := fmt.Sprintf("HTTP %d", status)
	if e.Message != "" {
		detail += ": " + e.Message
	}
	switch {
	case status == http.StatusNotFound && kind == opGetSandbox && hasBody:
		e.kind = adapter.ErrNotFound
	case status == http.StatusNotFound && hasBody:
		// Delete, pause or resume of an absent id: the API said so, but the
		// contract reserves not_found for GET; confirm with Get.
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail}
	case status == http.StatusTooManyRequests:
		e.kind = &adapter.RateLimitedError{RetryAfter: hosted.RetryAfter(h)}
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.kind = &adapter.DeniedError{Detail: detail}
	case status == http.StatusBadRequest || status == http.StatusConflict:
		e.kind = &adapter.InvalidError{Detail: detail}
	case status >= 500, status == http.StatusNotFound, status == http.StatusRequestTimeout:
		e.kind = &adapter.UnavailableError{Detail: detail}
	default:
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail}
	}
	return e
}

// connectStatusCode is the Connect protocol's HTTP-status-to-code table,
// used when a unary answer or a stream's headers carry no Connect body
// (a proxy spoke, not envd).
func connectStatusCode(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInternal
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeUnimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return CodeUnavailable
	}
	return CodeUnknown
}

// connectError maps envd's (or its proxy's) answer into the taxonomy.
// fromEnvd says the code came from a Connect error body, not from the HTTP
// status of a proxy; h may be nil.
func connectError(op string, status int, h http.Header, code, message string, fromEnvd bool, red redactor) error {
	e := &Error{Op: op, Status: status, Message: red.clean(message)}
	if fromEnvd {
		e.Code = code
	}
	detail := code
	if status != 0 {
		detail = fmt.Sprintf("HTTP %d %s", status, code)
	}
	if e.Message != "" {
		detail += ": " + e.Message
	}
	switch {
	case status == http.StatusTooManyRequests || code == CodeResourceExhausted:
		e.kind = &adapter.RateLimitedError{RetryAfter: hosted.RetryAfter(h)}
	case !fromEnvd:
		// A proxy's answer (E2B's edge gives 502 for a sandbox it cannot
		// reach) proves nothing about the sandbox or the process.
		switch status {
		case http.StatusUnauthorized, http.StatusForbidden:
			e.kind = &adapter.DeniedError{Detail: detail}
		default:
			e.kind = &adapter.UnavailableError{Detail: detail}
		}
	case code == CodeUnauthenticated || code == CodePermissionDenied:
		e.kind = &adapter.DeniedError{Detail: detail}
	case code == CodeInvalidArgument || code == CodeFailedPrecondition || code == CodeOutOfRange || code == CodeAlreadyExists:
		e.kind = &adapter.InvalidError{Detail: detail}
	case code == CodeUnavailable || code == CodeDeadlineExceeded || code == CodeAborted || code == CodeCanceled:
		e.kind = &adapter.UnavailableError{Detail: detail}
	case code == CodeUnimplemented:
		e.kind = fmt.Errorf("%s: %w", detail, adapter.ErrNotSupported)
	default:
		// not_found (a process, see IsProcessNotFound), unknown, internal,
		// data_loss: envd answered and the answer fits no other kind.
		e.kind = &adapter.ProviderError{Provider: provider, Detail: detail}
	}
	return e
}

// transportError maps a failure with no HTTP answer (refused, reset,
// timeout, a body cut short). The caller's own context ending wins: the
// result is then the context error, not a provider kind.
func transportError(ctx context.Context, op string, err error, red redactor) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", op, ctxErr)
	}
	return &Error{Op: op, kind: &adapter.UnavailableError{Detail: red.clean(err.Error())}}
}

// redactor removes the secrets it knows from text that came from outside
// (server messages, transport errors) before it enters an error.
type redactor []Secret

func (r redactor) clean(s string) string { return secret.Redact(s, r...) }
