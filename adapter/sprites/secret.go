package sprites

import (
	"encoding/json"
	"fmt"
	"log/slog"
)

const redacted = "[redacted]"

// Secret holds a credential (the API token). Every rendering of it — fmt
// with any verb, JSON, text, slog — is "[redacted]"; only [Secret.Reveal]
// gives the value, and this package calls it only to set the Authorization
// header. The zero value is the empty secret.
//
// The value is held by a closure: reflection (%#v of a struct holding a
// Secret in an unexported field) prints a func as an address, never what it
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

// Format writes "[redacted]" for every verb.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue keeps the secret out of slog output.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON writes "[redacted]".
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

// MarshalText writes "[redacted]".
func (s Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
