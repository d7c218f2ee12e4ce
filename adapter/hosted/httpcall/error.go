package httpcall

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/secret"
)

// Error is the detail of a failed hosted-provider call, beneath its
// taxonomy kind: errors.Is and errors.As on it reach the adapter error
// (for example *adapter.RateLimitedError) and, when set, the provider's
// own sentinel through Unwrap. Status and Code let the layer above tell
// apart answers that share a kind without matching text. Every provider
// returns this one type (e2b.Error, daytona.Error and sprites.Error are
// aliases of it).
type Error struct {
	// Provider names the provider ("e2b", "daytona", "sprites").
	Provider string
	// Op is the call that failed, as a short verb phrase ("get sandbox x").
	Op string
	// Status is the HTTP status of the answer, 0 when none arrived.
	Status int
	// Code is the provider's machine-readable error code when its answer
	// carried one (E2B's Connect code or numeric API code as text,
	// Sprites' "error" field); empty otherwise.
	Code string
	// Message is the provider's message with every secret removed.
	Message string
	// OwnBody is true when the answer carried the provider's own error
	// body (not a proxy's page).
	OwnBody bool
	// OwnStatus is, for an answer the provider's own daemon gave, the
	// status its answer means: Status, or another one the daemon's
	// message names (Daytona's toolbox wraps a 404 into a 500). 0 when the
	// provider does not tell, or the answer was not its own.
	OwnStatus int

	kind  error // the taxonomy error
	cause error // the provider's sentinel, or nil
}

// NewError returns the failure of op at provider whose taxonomy error is
// kind (status 0 when no answer arrived).
func NewError(provider, op string, status int, kind error) *Error {
	return &Error{Provider: provider, Op: op, Status: status, kind: kind}
}

// WithCause adds the provider's own sentinel, matched by errors.Is
// beside the taxonomy kind, and returns e.
func (e *Error) WithCause(cause error) *Error {
	e.cause = cause
	return e
}

func (e *Error) Error() string {
	if e.cause != nil {
		return e.Op + ": " + e.cause.Error() + ": " + e.kind.Error()
	}
	return e.Op + ": " + e.kind.Error()
}

// Unwrap returns the taxonomy error and, when set, the provider's
// sentinel.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// Kind is the taxonomy kind of e.
func (e *Error) Kind() adapter.Kind { return adapter.KindOf(e.kind) }

// Own says whether a Rule holds for the provider's own error body, for
// another's (a proxy, a load balancer, a wrong URL), or for either.
type Own int8

// The values of Rule.Own.
const (
	AnyBody Own = iota
	OwnBody
	ForeignBody
)

// Op is a provider's class of call, one bit each (opGetSandbox = 1 <<
// iota), so a Rule can name several.
type Op uint32

// Rule is one row of a provider's error table: it holds when every
// condition it names holds. Zero conditions hold for every answer.
type Rule struct {
	// Ops holds when the call's class is one of these bits; 0: any call.
	Ops Op
	// Status holds when the status is one of these; empty: any (see Min).
	Status []int
	// Min holds when the status is at least Min; 0: no bound.
	Min int
	// Own says whose body the answer must carry.
	Own Own
	// Code holds when the answer's code is one of these; empty: any.
	Code []string
	// Kind is the taxonomy kind the row gives.
	Kind adapter.Kind
	// Cause, when set, is the provider's sentinel added beside Kind.
	Cause error
	// Note is appended to the detail of the kind.
	Note string
}

func (r *Rule) holds(a Answer) bool {
	if r.Ops != 0 && r.Ops&a.Op == 0 {
		return false
	}
	if len(r.Status) > 0 && !slices.Contains(r.Status, a.Status) {
		return false
	}
	if r.Min != 0 && a.Status < r.Min {
		return false
	}
	if (r.Own == OwnBody && !a.Own) || (r.Own == ForeignBody && a.Own) {
		return false
	}
	return len(r.Code) == 0 || slices.Contains(r.Code, a.Code)
}

// Table is a provider's error classification as data: the first Rule
// that holds gives the kind; an answer no rule holds for is
// *adapter.ProviderError.
type Table struct {
	Provider string
	Rules    []Rule
}

// Answer is what a Table judges of a failed answer.
type Answer struct {
	// Op is the call's class (a bit of the provider's own Op constants).
	Op Op
	// Status is the status the rules match: the HTTP status, or the one
	// the provider's own answer means (Error.OwnStatus).
	Status int
	// Own says the answer carried the provider's own error body.
	Own bool
	// Code is what Rule.Code matches: the provider's error code, or a
	// mark the provider derived from the body.
	Code string
	// Detail is the text of the taxonomy error (see Detail).
	Detail string
	// RetryAfter is the wait a 429 asked for.
	RetryAfter time.Duration
}

// Classify sets e's kind from the first rule that holds for a and
// returns e. e carries what the provider read of the answer (Op, Status,
// Code, Message, ...); its Provider is set to the table's.
func (t *Table) Classify(e *Error, a Answer) *Error {
	e.Provider = t.Provider
	for i := range t.Rules {
		r := &t.Rules[i]
		if r.holds(a) {
			e.kind = KindError(t.Provider, r.Kind, a.Detail+r.Note, a.RetryAfter)
			e.cause = r.Cause
			return e
		}
	}
	e.kind = &adapter.ProviderError{Provider: t.Provider, Detail: a.Detail}
	e.cause = nil
	return e
}

// sentinels are the kinds that carry no detail.
var sentinels = map[adapter.Kind]error{
	adapter.KindNotFound:      adapter.ErrNotFound,
	adapter.KindTruncated:     adapter.ErrTruncated,
	adapter.KindCommandExited: adapter.ErrCommandExited,
	adapter.KindLost:          adapter.ErrLost,
}

// detailed make the kinds that carry a detail (RateLimited and Provider
// are KindError's own).
var detailed = map[adapter.Kind]func(string) error{
	adapter.KindNotSupported:  func(d string) error { return fmt.Errorf("%s: %w", d, adapter.ErrNotSupported) },
	adapter.KindUnavailable:   func(d string) error { return &adapter.UnavailableError{Detail: d} },
	adapter.KindDenied:        func(d string) error { return &adapter.DeniedError{Detail: d} },
	adapter.KindInvalid:       func(d string) error { return &adapter.InvalidError{Detail: d} },
	adapter.KindRestoreFailed: func(d string) error { return &adapter.RestoreFailedError{Detail: d} },
	adapter.KindWriteFailed:   func(d string) error { return &adapter.WriteFailedError{Detail: d} },
}

// KindError returns the taxonomy error of kind k with detail: the
// sentinel for the kinds without detail, the typed error for the others.
func KindError(provider string, k adapter.Kind, detail string, retryAfter time.Duration) error {
	if err, ok := sentinels[k]; ok {
		return err
	}
	if mk, ok := detailed[k]; ok {
		return mk(detail)
	}
	if k == adapter.KindRateLimited {
		return &adapter.RateLimitedError{RetryAfter: retryAfter}
	}
	return &adapter.ProviderError{Provider: provider, Detail: detail}
}

// Detail renders an answer for the taxonomy error: "HTTP 404", then the
// code and the message when there are ("HTTP 502 unavailable: text",
// "unknown: text" when no status arrived).
func Detail(status int, code, message string) string {
	d := code
	if status != 0 {
		d = fmt.Sprintf("HTTP %d", status)
		if code != "" {
			d += " " + code
		}
	}
	if message != "" {
		d += ": " + message
	}
	return d
}

// TransportError maps a failure with no HTTP answer (refused, reset,
// timeout, a body cut short) to *adapter.UnavailableError; uncertain says
// the call may have taken effect. The caller's own context ending wins:
// the result is then the context error, not a provider kind. The detail
// never quotes the request URL (a *url.Error's text does, and a URL may
// carry an argv or an environment).
func TransportError(ctx context.Context, provider, op string, err error, uncertain bool, red Redactor) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", op, ctxErr)
	}
	return NewError(provider, op, 0, &adapter.UnavailableError{Detail: red.Clean(URLFree(err)), Uncertain: uncertain})
}

// URLFree renders err without the URL a *url.Error (or a wrapper quoting
// it) would print.
func URLFree(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}

// Redactor removes the secrets and the verbatim strings it knows from
// text that came from outside (server messages, transport errors) before
// it enters an error.
type Redactor struct {
	Secrets []secret.Secret
	// Plain are removed verbatim (request URLs that carry an argv).
	Plain []string
}

// Redact returns a Redactor of secrets.
func Redact(secrets ...secret.Secret) Redactor { return Redactor{Secrets: secrets} }

// Clean returns s without the redactor's secrets and plain strings.
func (r Redactor) Clean(s string) string {
	for _, p := range r.Plain {
		if p != "" {
			s = strings.ReplaceAll(s, p, "[request]")
		}
	}
	return secret.Redact(s, r.Secrets...)
}
