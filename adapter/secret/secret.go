// Package secret holds a credential so that it cannot be logged by
// accident. The hosted-provider adapters (adapter/e2b, adapter/daytona,
// adapter/sprites) keep their API keys and access tokens in a [Secret].
//
// Invariant: every rendering of a Secret — fmt with any verb (%v, %+v,
// %#v, %s, %q, %x, ...), JSON, text, slog — is "[redacted]", and so is
// reflection's dump of a struct holding one in an unexported field; only
// [Secret.Reveal] gives the value. The package imports only the standard
// library.
package secret

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"strings"
)

// Redacted is what every rendering of a [Secret] writes.
const Redacted = "[redacted]"

// Secret holds a credential. The zero value is the empty secret.
//
// The value is held by a closure: reflection (fmt's %#v of a struct that
// holds a Secret in an unexported field, where no method is called, or a
// bad verb's fallback dump) prints a func as an address, never what it
// captured. Secrets are not comparable with ==; compare Reveal.
type Secret struct{ reveal func() string }

// New wraps a credential; New("") is the zero Secret.
func New(v string) Secret {
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
func (s Secret) String() string { return Redacted }

// GoString returns "[redacted]", so %#v of a struct holding it is safe.
func (s Secret) GoString() string { return Redacted }

// Format writes "[redacted]" for every verb (%s, %v, %x, %q, ...).
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(Redacted)) }

// LogValue keeps the secret out of slog output.
func (s Secret) LogValue() slog.Value { return slog.StringValue(Redacted) }

// MarshalJSON writes "[redacted]": a logged or persisted struct never
// carries the credential.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(Redacted) }

// MarshalText writes "[redacted]".
func (s Secret) MarshalText() ([]byte, error) { return []byte(Redacted), nil }

// UnmarshalJSON reads the credential from an API answer (a JSON string or
// null; null and "" give the zero Secret).
func (s *Secret) UnmarshalJSON(b []byte) error {
	var v *string
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("decode secret: %w", err)
	}
	*s = Secret{}
	if v != nil {
		*s = New(*v)
	}
	return nil
}

// Redact returns s with the value of every secret in secrets replaced by
// Redacted: for text that came from outside (a server's message, a
// transport error quoting a request) before it enters an error or a log.
func Redact(s string, secrets ...Secret) string {
	for _, sec := range secrets {
		if v := sec.Reveal(); v != "" {
			s = strings.ReplaceAll(s, v, Redacted)
		}
	}
	return s
}
