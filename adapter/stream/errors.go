package stream

import (
	"fmt"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

// Kind returns the adapter taxonomy kind of wire code c: the kind with the
// same name, for every code of wire.ErrorTable. ok is false for a code
// outside the table (from a newer daemon, or garbage).
func Kind(c wire.Code) (k adapter.Kind, ok bool) {
	if _, ok := wire.RowOf(c); !ok {
		return adapter.KindNone, false
	}
	return adapter.Kind(c), true
}

// Code returns the wire code of adapter kind k, the inverse of Kind. ok is
// false for KindNone and KindContext, which no wire answer carries.
func Code(k adapter.Kind) (c wire.Code, ok bool) {
	if _, ok := wire.RowOf(wire.Code(k)); !ok {
		return "", false
	}
	return wire.Code(k), true
}

// KindError returns the adapter error for e's code, ok false for a code
// outside wire.ErrorTable. The detail-less kinds (not_found, truncated,
// not_supported, command_exited, lost) are their bare sentinels; the typed
// kinds carry detail, e's retry delay (rate_limited) and whether it is
// uncertain (unavailable, from the field or an older daemon's detail
// prefix). provider names the adapter in a *adapter.ProviderError.
//
// KindError decides nothing about trust: a caller that got e from
// somewhere other than the authority (a proxy's 404, an error frame's
// not_found) must not pass it here as not_found. FrameError and the
// client's response mapping apply those rules first.
func KindError(provider string, e *wire.Error, detail string) (err error, ok bool) {
	switch e.Code {
	case wire.CodeNotFound:
		return adapter.ErrNotFound, true
	case wire.CodeTruncated:
		return adapter.ErrTruncated, true
	case wire.CodeNotSupported:
		return adapter.ErrNotSupported, true
	case wire.CodeCommandExited:
		return adapter.ErrCommandExited, true
	case wire.CodeLost:
		return adapter.ErrLost, true
	case wire.CodeRateLimited:
		return &adapter.RateLimitedError{RetryAfter: time.Duration(e.RetryAfterMS) * time.Millisecond}, true
	case wire.CodeUnavailable:
		return &adapter.UnavailableError{Detail: detail, Uncertain: e.IsUncertain()}, true
	case wire.CodeDenied:
		return &adapter.DeniedError{Detail: detail}, true
	case wire.CodeInvalid:
		return &adapter.InvalidError{Detail: detail}, true
	case wire.CodeRestoreFailed:
		return &adapter.RestoreFailedError{Detail: detail}, true
	case wire.CodeWriteFailed:
		return &adapter.WriteFailedError{Detail: detail}, true
	case wire.CodeProvider:
		return &adapter.ProviderError{Provider: provider, Detail: detail}, true
	}
	return nil, false
}

// FrameError converts the payload of an error frame into the taxonomy; op
// says what was read ("session x"). A not_found inside a stream is not a
// registry answer, so it is unavailable, never adapter.ErrNotFound; a code
// this version does not know is unavailable too (the stream broke in a way
// it cannot judge). Sentinel kinds are wrapped with the detail.
func FrameError(provider, op string, we *wire.Error) error {
	detail := op + ": " + we.Error()
	if we.Code == wire.CodeNotFound {
		return &adapter.UnavailableError{Detail: detail}
	}
	err, ok := KindError(provider, we, detail)
	if !ok {
		return &adapter.UnavailableError{Detail: detail}
	}
	switch err.(type) {
	case *adapter.RateLimitedError, *adapter.UnavailableError, *adapter.DeniedError, *adapter.InvalidError,
		*adapter.RestoreFailedError, *adapter.WriteFailedError, *adapter.ProviderError:
		return err
	}
	return fmt.Errorf("%s: %w", detail, err)
}
