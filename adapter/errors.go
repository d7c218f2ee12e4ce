package adapter

import (
	"errors"
	"fmt"
	"time"
)

// The closed error taxonomy. Every error an [Adapter] returns is, after
// unwrapping with [errors.Is] or [errors.As], exactly one of the kinds below,
// or a context error (context.Canceled, context.DeadlineExceeded) when the
// caller's own context ended first. Adapters normalize provider errors into
// this taxonomy at their boundary and may wrap them with a short verb phrase
// ("get sandbox x: %w"); callers match with errors.Is / errors.As, never on
// text.
//
// The four sentinel kinds carry no detail:
var (
	// ErrNotFound is returned when the sandbox (or session) definitively does
	// not exist: the provider's own authority said so. It is the only
	// "definitively gone" answer: a reaper may destroy on it. A partition, a
	// throttle, an expired credential, a 5xx or a proxy's 404 must never be
	// reported as ErrNotFound (see [UnavailableError]).
	ErrNotFound = errors.New("not found")

	// ErrTruncated is returned when an attach cursor points behind the data
	// the provider still retains. The caller has lost bytes; it is never
	// papered over with a silent mid-stream start.
	ErrTruncated = errors.New("truncated: cursor is behind retained output")

	// ErrNotSupported is returned by every call behind a capability the
	// adapter does not advertise in [Adapter.Capabilities]. An adapter never
	// fakes an unsupported operation (no destroy as a fallback for terminate,
	// no accepted-but-unenforced network policy).
	ErrNotSupported = errors.New("not supported")

	// ErrCommandExited is returned by [Adapter.WriteStdin] and
	// [Adapter.CloseStdin] when the command has already exited. It is data,
	// not a transport failure: a write racing the command's exit is normal.
	ErrCommandExited = errors.New("command exited")

	// ErrLost is the one addition to the seed taxonomy: it is carried by a
	// terminal frame (and returned by [Adapter.TerminateSession]) when a
	// session ended and no exit record exists (its supervisor died). It is
	// definitive and never an exit code; retrying the attach gives it again.
	ErrLost = errors.New("session lost: ended without an exit record")
)

// Kind sentinels for the typed errors below. errors.Is(err, ErrUnavailable)
// is true for any *UnavailableError in err's chain, and so on; use
// errors.As to read the detail.
var (
	ErrRateLimited   = errors.New("rate limited")
	ErrUnavailable   = errors.New("unavailable")
	ErrDenied        = errors.New("denied")
	ErrInvalid       = errors.New("invalid")
	ErrRestoreFailed = errors.New("restore failed")
	ErrWriteFailed   = errors.New("write failed")
	ErrProvider      = errors.New("provider error")
)

// RateLimitedError is returned when the provider throttled the call.
// RetryAfter is the provider's requested wait (zero when it named none);
// [WithBackoff] waits at least that long. It is transient.
type RateLimitedError struct{ RetryAfter time.Duration }

func (e *RateLimitedError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("rate limited: retry after %v", e.RetryAfter)
	}
	return "rate limited"
}

// Is reports whether target is ErrRateLimited.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

// UnavailableError is returned for every failure that does not prove
// anything about the sandbox: a refused or reset connection, a timeout, a
// 5xx, a 404 without the provider's own not-found body, DNS or TLS failure,
// an interrupted listing, an uncertain terminate. It is transient.
//
// Uncertain is true when the call may or may not have taken effect (a
// terminate that could not confirm the end, a start that may be running):
// retry with the same id; never assume either outcome.
type UnavailableError struct {
	Detail    string
	Uncertain bool
}

func (e *UnavailableError) Error() string { return "unavailable: " + e.Detail }

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// DeniedError is returned when the provider refused the caller's credential
// or authority (401, 403, quota). It is not transient.
type DeniedError struct{ Detail string }

func (e *DeniedError) Error() string { return "denied: " + e.Detail }

// Is reports whether target is ErrDenied.
func (e *DeniedError) Is(target error) bool { return target == ErrDenied }

// InvalidError is returned when the request itself is wrong: a bad name, an
// out-of-range grace, a cursor beyond the end of a stream, a session id
// reused for a different command, an unknown provider in a [Registry], an
// operation on a suspended sandbox. It is not transient.
type InvalidError struct{ Detail string }

func (e *InvalidError) Error() string { return "invalid: " + e.Detail }

// Is reports whether target is ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// RestoreFailedError is returned when a resume or checkpoint restore could
// not give back the sandbox's disk. The sandbox is not silently replaced by
// a fresh one. It is not transient.
type RestoreFailedError struct{ Detail string }

func (e *RestoreFailedError) Error() string { return "restore failed: " + e.Detail }

// Is reports whether target is ErrRestoreFailed.
func (e *RestoreFailedError) Is(target error) bool { return target == ErrRestoreFailed }

// WriteFailedError is returned when stdin bytes could not be delivered to a
// command that is still running (for example a full or broken pipe inside
// the sandbox). Exited commands give ErrCommandExited instead. It is not
// transient: whether any byte arrived is unknown.
type WriteFailedError struct{ Detail string }

func (e *WriteFailedError) Error() string { return "write failed: " + e.Detail }

// Is reports whether target is ErrWriteFailed.
func (e *WriteFailedError) Is(target error) bool { return target == ErrWriteFailed }

// ProviderError is the catch-all for a provider answer that fits no other
// kind. Provider names the adapter; Detail is the provider's message with
// secrets removed. It is not transient.
type ProviderError struct{ Provider, Detail string }

func (e *ProviderError) Error() string { return e.Provider + ": " + e.Detail }

// Is reports whether target is ErrProvider.
func (e *ProviderError) Is(target error) bool { return target == ErrProvider }

// Kind is the wire name of an error kind, spelled as the contract this
// package ports spells it. Wire protocols and metrics use it; Go code
// matches with errors.Is.
type Kind string

// The kinds, in the order of the taxonomy.
const (
	KindNone          Kind = ""
	KindNotFound      Kind = "not_found"
	KindTruncated     Kind = "truncated"
	KindNotSupported  Kind = "not_supported"
	KindCommandExited Kind = "command_exited"
	KindLost          Kind = "lost"
	KindRateLimited   Kind = "rate_limited"
	KindUnavailable   Kind = "unavailable"
	KindDenied        Kind = "denied"
	KindInvalid       Kind = "invalid"
	KindRestoreFailed Kind = "restore_failed"
	KindWriteFailed   Kind = "write_failed"
	KindProvider      Kind = "provider"
	// KindContext is a context.Canceled or context.DeadlineExceeded from the
	// caller's own context. It is not part of the taxonomy proper.
	KindContext Kind = "context"
)

var kindOrder = []struct {
	sentinel error
	kind     Kind
}{
	{ErrNotFound, KindNotFound},
	{ErrTruncated, KindTruncated},
	{ErrNotSupported, KindNotSupported},
	{ErrCommandExited, KindCommandExited},
	{ErrLost, KindLost},
	{ErrRateLimited, KindRateLimited},
	{ErrUnavailable, KindUnavailable},
	{ErrDenied, KindDenied},
	{ErrInvalid, KindInvalid},
	{ErrRestoreFailed, KindRestoreFailed},
	{ErrWriteFailed, KindWriteFailed},
	{ErrProvider, KindProvider},
}

// Kinds returns the kinds of the taxonomy proper, in its order: every kind
// KindOf can return for a non-nil error except KindContext.
func Kinds() []Kind {
	ks := make([]Kind, len(kindOrder))
	for i, k := range kindOrder {
		ks[i] = k.kind
	}
	return ks
}

// KindOf returns the taxonomy kind of err: KindNone for nil, KindContext for
// a context error, and KindProvider for an error outside the taxonomy (an
// adapter bug: it should have normalized it).
func KindOf(err error) Kind {
	if err == nil {
		return KindNone
	}
	for _, k := range kindOrder {
		if errors.Is(err, k.sentinel) {
			return k.kind
		}
	}
	if isContextErr(err) {
		return KindContext
	}
	return KindProvider
}

// Transient reports whether err is worth retrying unchanged: a
// *RateLimitedError or an *UnavailableError. Every other kind, nil and
// context errors are not transient. In particular ErrNotFound is definitive.
func Transient(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRateLimited)
}
