package sprites

import "github.com/agentrunner/runner/adapter/secret"

// Secret holds a credential (the API token). Every rendering of it — fmt with any
// verb, JSON, text, slog — is "[redacted]"; only [Secret.Reveal] gives the
// value, and this package calls it only to put it on the wire. The zero
// value is the empty secret. It is [secret.Secret], shared by the hosted
// providers.
type Secret = secret.Secret

// NewSecret wraps a credential.
func NewSecret(v string) Secret { return secret.New(v) }
