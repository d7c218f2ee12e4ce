package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/stream"
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
	// Uncertain is set on an unavailable answer whose outcome runnerd
	// could not confirm (the body's uncertain field, or an older daemon's
	// detail prefix wire.DetailUncertain): the call may have taken effect.
	Uncertain bool
	// ExecError is the body's exec_error: with the invalid kind, why the
	// command of a spawn or exec could not be started
	// (wire.ExecErrorNotFound, wire.ExecErrorNotExecutable), else "".
	ExecError wire.ExecError
	// Exhausted is set on an unavailable answer of a host that takes no
	// more sandboxes or sessions (wire.Error.Exhausted): nothing was
	// created; another host may take it.
	Exhausted bool
	// Reason is the body's reason: with the invalid kind (409), which
	// conflict it is (wire.ReasonSandboxSuspended, ...), else "". A
	// daemon before the field sends none.
	Reason wire.Reason

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
// (refused, reset, timeout, DNS, TLS, a cut body) is unavailable, and
// keeps the transport's error as its cause (see [Refused]), except a
// refused certificate (tls.go), which is denied: retrying cannot fix it.
func transportErr(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%s: %w", op, cerr)
	}
	if isCertRefusal(err) {
		return &adapter.DeniedError{Detail: fmt.Sprintf("%s: TLS: %v", op, err)}
	}
	return &transportError{kind: &adapter.UnavailableError{Detail: fmt.Sprintf("%s: %v", op, err)}, cause: err}
}

// transportError is an unavailable error that no answer caused: it is
// *adapter.UnavailableError for errors.As and errors.Is, and the
// transport's own error (a *net.OpError, syscall.ECONNREFUSED) too.
type transportError struct {
	kind  *adapter.UnavailableError
	cause error
}

func (e *transportError) Error() string   { return e.kind.Error() }
func (e *transportError) Unwrap() []error { return []error{e.kind, e.cause} }

// Refused reports whether err is a connection that nothing accepted: a
// TCP connect refused, or a unix socket that does not exist or that no
// process listens on. Then no runnerd serves at the address (as opposed
// to one that answered 503, or a connection cut mid-call).
func Refused(err error) bool {
	var te *transportError
	if !errors.As(err, &te) {
		return false
	}
	var op *net.OpError
	if !errors.As(te.cause, &op) || op.Op != "dial" {
		return false
	}
	return errors.Is(op.Err, syscall.ECONNREFUSED) || errors.Is(op.Err, syscall.ENOENT)
}

// responseErr classifies a non-2xx answer. It reads (a bounded part of)
// the body.
func responseErr(ctx context.Context, op string, resp *http.Response) error {
	header := resp.Header.Get(wire.HeaderError)
	body, decoded := decodeErrorBody(resp)
	e := &APIError{Op: op, Status: resp.StatusCode}
	if decoded {
		e.Code, e.Detail, e.ExecError, e.Reason = body.Code, body.Detail, body.ExecError, body.Reason
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
	if wire.Code(header) == wire.CodeNotFound &&
		!(wire.IsDefinitiveAbsence(resp.StatusCode, header) && decoded && body.Code == wire.CodeNotFound) {
		return unavailablef("%s: not_found that is not definitive (status %d, body decoded %v)", op, resp.StatusCode, decoded)
	}
	// The header decides the kind (wire.ErrorTable, through adapter/stream);
	// the body adds detail, the retry delay and uncertainty.
	we := &wire.Error{Code: wire.Code(header), Detail: e.Detail, RetryAfterMS: e.RetryAfter.Milliseconds()}
	if decoded {
		we.Uncertain = body.Uncertain
		e.Exhausted = body.Code == wire.CodeUnavailable && body.Exhausted
	}
	e.Uncertain = we.Code == wire.CodeUnavailable && we.IsUncertain()
	kind, ok := stream.KindError(Provider, we, detail)
	switch {
	case ok:
		e.kind = kind
	case resp.StatusCode >= 500:
		e.kind = &adapter.UnavailableError{Detail: detail}
	default:
		e.kind = &adapter.ProviderError{Provider: Provider, Detail: "unknown error code: " + detail}
	}
	return e
}

// isNotFound reports a definitive absence.
func isNotFound(err error) bool { return errors.Is(err, adapter.ErrNotFound) }
