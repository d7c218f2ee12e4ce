package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

// This file is the one place that maps errors to HTTP status and wire code.
// Handlers return Go errors; writeError classifies them here. Statuses come
// from wire.ErrorTable (the one error table); the few cases with a more
// specific status than a code's default (409 conflict, 413, 404 no route)
// use one the table lists for that code.

// apiError is an error with a decided status and wire code. Handlers build
// them with the constructors below when they know the answer; anything
// else is classified by classify.
type apiError struct {
	status       int
	code         wire.Code
	detail       string
	retryAfterMS int64
	uncertain    bool // unavailable whose outcome is unknown (errUncertain)
}

func (e *apiError) Error() string { return fmt.Sprintf("%s (%d): %s", e.code, e.status, e.detail) }

func errInvalid(format string, args ...any) *apiError {
	return &apiError{status: wire.CodeInvalid.Status(), code: wire.CodeInvalid, detail: fmt.Sprintf(format, args...)}
}

func errConflict(format string, args ...any) *apiError {
	return &apiError{status: http.StatusConflict, code: wire.CodeInvalid, detail: fmt.Sprintf(format, args...)}
}

func errTooLarge(limit int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: wire.CodeInvalid,
		detail: fmt.Sprintf("body larger than %d bytes", limit)}
}

func errNotFound(format string, args ...any) *apiError {
	return &apiError{status: wire.CodeNotFound.Status(), code: wire.CodeNotFound, detail: fmt.Sprintf(format, args...)}
}

func errNotSupported(format string, args ...any) *apiError {
	return &apiError{status: wire.CodeNotSupported.Status(), code: wire.CodeNotSupported, detail: fmt.Sprintf(format, args...)}
}

// errUnavailable is a transient failure. Called as
// errUnavailable("%s: ...", wire.DetailUncertain, ...), the form the
// handlers used before errUncertain existed, it is errUncertain.
func errUnavailable(format string, args ...any) *apiError {
	ae := &apiError{status: wire.CodeUnavailable.Status(), code: wire.CodeUnavailable, detail: fmt.Sprintf(format, args...)}
	if len(args) > 0 && args[0] == wire.DetailUncertain && strings.HasPrefix(format, "%s: ") {
		ae.uncertain = true
	}
	return ae
}

// errUncertain is unavailable for a call whose outcome runnerd could not
// confirm: the body says uncertain, and its detail keeps the
// wire.DetailUncertain prefix that clients before the field read.
func errUncertain(format string, args ...any) *apiError {
	return &apiError{status: wire.CodeUnavailable.Status(), code: wire.CodeUnavailable, uncertain: true,
		detail: wire.DetailUncertain + ": " + fmt.Sprintf(format, args...)}
}

func errCommandExited() *apiError {
	return &apiError{status: wire.CodeCommandExited.Status(), code: wire.CodeCommandExited, detail: "the command has exited"}
}

func errTruncated(detail string) *apiError {
	return &apiError{status: wire.CodeTruncated.Status(), code: wire.CodeTruncated, detail: detail}
}

func errWriteFailed(format string, args ...any) *apiError {
	return &apiError{status: wire.CodeWriteFailed.Status(), code: wire.CodeWriteFailed, detail: fmt.Sprintf(format, args...)}
}

func errProvider(format string, args ...any) *apiError {
	return &apiError{status: wire.CodeProvider.Status(), code: wire.CodeProvider, detail: fmt.Sprintf(format, args...)}
}

var (
	errDenied  = &apiError{status: wire.CodeDenied.Status(), code: wire.CodeDenied, detail: "missing or wrong bearer token"}
	errNoRoute = &apiError{status: http.StatusNotFound, code: wire.CodeInvalid, detail: wire.DetailNoRoute}
)

// classify turns any error into an apiError. Absence becomes not_found only
// through errNotFound, which handlers build after the registry answered
// registry.ErrNotFound for the exact thing addressed; a bare
// registry.ErrNotFound reaching here is a bug and is answered unavailable,
// never not_found.
func classify(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var mbe *http.MaxBytesError
	var ce *journal.CursorError
	switch {
	case errors.As(err, &ce):
		// A cursor behind the retained data or beyond the end; the code
		// is shim.JournalCode's, the one journal mapping attach frames use.
		c := shim.JournalCode(err)
		return &apiError{status: c.Status(), code: c, detail: ce.Error()}
	case errors.Is(err, journal.ErrUnknownStream):
		return errInvalid("%v", err)
	case errors.Is(err, shim.ErrExited):
		return errCommandExited()
	case errors.Is(err, shim.ErrInvalid):
		return errInvalid("%v", err)
	case errors.Is(err, shim.ErrWriteFailed):
		return errWriteFailed("%v", err)
	case errors.Is(err, shim.ErrFailed):
		return errProvider("%v", err)
	case errors.As(err, &mbe):
		return errTooLarge(mbe.Limit)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return errUnavailable("%v", err)
	case errors.Is(err, registry.ErrNotFound):
		return errUnavailable("internal: unscoped absence: %v", err)
	}
	return errUnavailable("%v", err)
}

// writeError writes err as runnerd's error response and counts it.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := classify(err)
	s.metrics.countError(ae.code)
	if ae.status >= 500 {
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "code", ae.code, "err", ae.detail)
	}
	h := w.Header()
	h.Set(wire.HeaderError, string(ae.code))
	h.Set("Content-Type", "application/json")
	if ae.retryAfterMS > 0 {
		h.Set("Retry-After", strconv.FormatInt((ae.retryAfterMS+999)/1000, 10))
	}
	body, _ := json.Marshal(wire.ErrorBody{Error: wire.Error{Code: ae.code, Detail: ae.detail, RetryAfterMS: ae.retryAfterMS, Uncertain: ae.uncertain}})
	body = append(body, '\n')
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(ae.status)
	w.Write(body)
}

// classifyStart maps a failure of shim.Start. Only a failure of the
// caller's command itself (the shim reports phase exec: no such
// executable, not executable, a bad cwd, an unknown run-as user) is the
// caller's mistake (invalid); a full disk is write_failed; anything else
// (a fork the host refused, a shim that crashed, a journal, socket or
// namespace that could not be set up) is transient (unavailable), even
// when its errno is ENOENT or EACCES.
func classifyStart(err error) error {
	var se *shim.StartError
	switch {
	case errors.As(err, &se) && se.Phase == shim.PhaseExec:
		return errInvalid("start command: %v", err)
	case errors.Is(err, shim.ErrInvalid) && !errors.As(err, &se):
		return errInvalid("start command: %v", err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errWriteFailed("start session: %v", err)
	}
	return errUnavailable("start session: %v", err)
}
