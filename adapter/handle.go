package adapter

import (
	"fmt"
	"log/slog"
)

// Handle names one incarnation of a sandbox. It is a value: copy it freely,
// compare it with [Handle.Same]. Handles are returned by [Adapter.Create],
// [Adapter.Get] and [Adapter.List]; a caller that persists a handle stores
// Provider, Name and ID and calls Get to rebuild it (Private is never
// serialized).
type Handle struct {
	// Provider is the registry name of the adapter that owns the sandbox
	// ([Adapter.Provider]); a [Registry] dispatches on it.
	Provider string
	// Name is the caller-supplied identity given to Create.
	Name string
	// ID is the incarnation id: the same for every handle of one sandbox,
	// different after a destroy and a re-create of the same name. A handle
	// whose ID no longer matches the live sandbox of that name refers to a
	// gone incarnation: operations on it return ErrNotFound, and Destroy of
	// it succeeds without touching the new incarnation.
	ID string
	// Private is provider-private data (tokens, routes, internal ids). It
	// never appears in any fmt verb, in slog output or in JSON.
	Private Private `json:"-"`
}

// Same reports whether h and o name the same incarnation of the same
// sandbox. Private data is not compared.
func (h Handle) Same(o Handle) bool {
	return h.Provider == o.Provider && h.Name == o.Name && h.ID == o.ID
}

// String returns "provider/name#id".
func (h Handle) String() string { return h.Provider + "/" + h.Name + "#" + h.ID }

// LogValue logs the public fields only.
func (h Handle) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("provider", h.Provider),
		slog.String("name", h.Name),
		slog.String("id", h.ID),
	)
}

// Private holds an adapter's private per-sandbox data. Its zero value holds
// nothing. Every formatting path (fmt verbs including %#v, String, GoString,
// slog, encoding/json, encoding.TextMarshaler) prints the fixed text
// "[private]", so a credential inside it cannot leak through a log line or
// an error message that includes a handle.
type Private struct{ v any }

// NewPrivate wraps v, which only the adapter that created it should read.
func NewPrivate(v any) Private { return Private{v: v} }

// Value returns the wrapped value (nil for the zero Private). Only the
// owning adapter calls it, and type-asserts the result.
func (p Private) Value() any { return p.v }

const redacted = "[private]"

// String returns "[private]".
func (p Private) String() string { return redacted }

// GoString returns "[private]".
func (p Private) GoString() string { return redacted }

// Format writes "[private]" for every verb.
func (p Private) Format(f fmt.State, verb rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue returns "[private]".
func (p Private) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText returns "[private]".
func (p Private) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// MarshalJSON returns the JSON string "[private]".
func (p Private) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }
