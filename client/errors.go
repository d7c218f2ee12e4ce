package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// This file is the one place that maps runnerd's answers and transport
// failures into the adapter taxonomy. The rule that keeps absence
// definitive: only a 404 whose Runner-Error header AND decoded body both
// say not_found becomes adapter.ErrNotFound. See doc.go for the table.

// APIError is an error response runnerd itself produced: it carried the
// Runner-Error header and a decodable error body. It unwraps to the
// adapter taxonomy kind (adapter.ErrNotFound, *adapter.InvalidError, ...),
// so callers match it with errors.Is / errors.As like any adapter error;
// errors.As(err, &apiErr) gives the status, code and detail for display.
type APIError struct {
	// Op is the request, "METHOD /path".
	Op string
	// Status is the HTTP status.
	Status int
	// Code is the wire error code.
	Code wire.Code
	// Detail is runnerd's free text (it never contains the token).
	Detail string
	// RetryAfter is the wait runnerd asked for (rate_limited), else 0.
	RetryAfter time.Duration

	kind error // the adapter kind: a sentinel or a typed error
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("%s: %d %s", e.Op, e.Status, e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap returns the adapter taxonomy error this answer maps to.
func (e *APIError) Unwrap() error { return e.kind }

func invalidf(format string, args ...any) error {
	return &adapter.InvalidError{Detail: fmt.Sprintf(format, args...)}
}

func unavailablef(format string, args ...any) error {
	return &adapter.UnavailableError{Detail: fmt.Sprintf(format, args...)}
}

// transportErr classifies a failure to get an answer at all: the caller's
// own context ending is returned as that context error; everything else
// (refused, reset, timeout, DNS, TLS, a cut body) is unavailable.
func transportErr(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%s: %w", op, cerr)
	}
	return unavailablef("%s: %v", op, err)
}

// responseErr classifies a non-2xx answer. It reads (a bounded part of)
// the body.
func responseErr(ctx context.Context, op string, resp *http.Response) error {
	header := resp.Header.Get(wire.HeaderError)
	body, decoded := decodeErrorBody(resp)
	e := &APIError{Op: op, Status: resp.StatusCode}
	if decoded {
		e.Code, e.Detail = body.Code, body.Detail
		if body.RetryAfterMS > 0 {
			e.RetryAfter = time.Duration(body.RetryAfterMS) * time.Millisecond
		}
	} else {
		e.Code = wire.Code(header)
	}
	if e.RetryAfter == 0 {
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	}
	detail := e.Error()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		// A throttle is transient whoever sent it.
		e.kind = &adapter.RateLimitedError{RetryAfter: e.RetryAfter}
		return e
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		e.kind = &adapter.DeniedError{Detail: detail}
		return e
	case header == "":
		// Not runnerd's answer (a proxy, a load balancer, another server
		// on the port): it proves nothing.
		if e.Code == "" {
			e.Code = wire.CodeUnavailable
		}
		return unavailablef("%s: %d without a %s header (not runnerd's answer)", op, resp.StatusCode, wire.HeaderError)
	}
	switch wire.Code(header) {
	case wire.CodeNotFound:
		if wire.IsDefinitiveAbsence(resp.StatusCode, header) && decoded && body.Code == wire.CodeNotFound {
			e.kind = adapter.ErrNotFound
			return e
		}
		return unavailablef("%s: not_found that is not definitive (status %d, body decoded %v)", op, resp.StatusCode, decoded)
	case wire.CodeTruncated:
		e.kind = adapter.ErrTruncated
	case wire.CodeNotSupported:
		e.kind = adapter.ErrNotSupported
	case wire.CodeCommandExited:
		e.kind = adapter.ErrCommandExited
	case wire.CodeRateLimited:
		e.kind = &adapter.RateLimitedError{RetryAfter: e.RetryAfter}
	case wire.CodeUnavailable:
		e.kind = &adapter.UnavailableError{Detail: detail}
	case wire.CodeDenied:
		e.kind = &adapter.DeniedError{Detail: detail}
	case wire.CodeInvalid:
		e.kind = &adapter.InvalidError{Detail: detail}
	case wire.CodeRestoreFailed:
		e.kind = &adapter.RestoreFailedError{Detail: detail}
	case wire.CodeWriteFailed:
		e.kind = &adapter.WriteFailedError{Detail: detail}
	case wire.CodeProvider:
		e.kind = &adapter.ProviderError{Provider: Provider, Detail: detail}
	default:
		if resp.StatusCode >= 500 {
			e.kind = &adapter.UnavailableError{Detail: detail}
		} else {
			e.kind = &adapter.ProviderError{Provider: Provider, Detail: "unknown error code: " + detail}
		}
	}
	return e
}

// wireErr converts an error frame's payload into the taxonomy.
func wireErr(op string, we *wire.Error) error {
	detail := op + ": " + we.Error()
	switch we.Code {
	case wire.CodeTruncated:
		return fmt.Errorf("%s: %w", detail, adapter.ErrTruncated)
	case wire.CodeNotFound:
		// Inside a stream this is not a registry answer; never definitive.
		return &adapter.UnavailableError{Detail: detail}
	case wire.CodeInvalid:
		return &adapter.InvalidError{Detail: detail}
	case wire.CodeWriteFailed:
		return &adapter.WriteFailedError{Detail: detail}
	case wire.CodeProvider:
		return &adapter.ProviderError{Provider: Provider, Detail: detail}
	case wire.CodeDenied:
		return &adapter.DeniedError{Detail: detail}
	case wire.CodeRateLimited:
		return &adapter.RateLimitedError{RetryAfter: time.Duration(we.RetryAfterMS) * time.Millisecond}
	}
	return &adapter.UnavailableError{Detail: detail}
}

// isNotFound reports a definitive absence.
func isNotFound(err error) bool { return errors.Is(err, adapter.ErrNotFound) }
