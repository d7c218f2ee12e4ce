package daytona

import (
	"encoding/json"
	"fmt"
	"log/slog"
)

const redacted = "[redacted]"

// Secret holds a credential (the API key). Every
// rendering of it — fmt with any verb, JSON, text, slog — is "[redacted]";
// only [Secret.Reveal] gives the value, and this package calls it only to
// set a request header. The zero value is the empty secret.
//
// The value is held by a closure: reflection (fmt's %#v of a struct that
// holds a Secret in an unexported field, where no method is called, or a
// bad verb's fallback dump) prints a func as an address, never what it
// captured. Secrets are not comparable with ==; compare Reveal.
type Secret struct{ reveal func() string }

// NewSecret wraps a credential.
func NewSecret(v string) Secret {
	if v == "" {
		return Secret{}
	}
	return Secret{reveal: func() string { return v }}
}

// Reveal returns the credential. Call it only to put it on the wire.
func (s Secret) Reveal() string {
	if s.reveal == nil {
		return ""
	}
	return s.reveal()
}

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.reveal == nil }

// String returns "[redacted]".
func (s Secret) String() string { return redacted }

// GoString returns "[redacted]", so %#v of a struct holding it is safe.
func (s Secret) GoString() string { return redacted }

// Format writes "[redacted]" for every verb (%s, %v, %x, %q, ...).
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue keeps the secret out of slog output.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON writes "[redacted]": a logged or persisted struct never
// carries the credential.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

// MarshalText writes "[redacted]".
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// UnmarshalJSON reads the credential from an API answer (a JSON string or null).
func (s *Secret) UnmarshalJSON(b []byte) error {
	var v *string
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = Secret{}
	if v != nil {
		*s = NewSecret(*v)
	}
	return nil
}
