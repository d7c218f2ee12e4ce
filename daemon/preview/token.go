package preview

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
)

// tokenBytes is the entropy of a token: 160 bits, which base32 encodes in
// exactly 32 characters with no padding.
const tokenBytes = 20

// TokenLen is the length of every token NewToken returns.
const TokenLen = tokenBytes * 8 / 5

// tokenEncoding is lowercase RFC 4648 base32 without padding: the characters
// a-z and 2-7, all legal in a DNS label and unchanged by a browser's
// lowercasing of host names.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewToken returns a fresh preview token: 160 bits from crypto/rand encoded as
// TokenLen lowercase base32 characters, safe as a DNS label. A token is a
// capability; store it like a credential.
func NewToken() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random token: %w", err)
	}
	return tokenEncoding.EncodeToString(b), nil
}

// validToken reports whether s has the exact shape NewToken produces. The
// Server consults Lookup only for well-formed tokens.
func validToken(s string) bool {
	if len(s) != TokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}

// tokenPrefix is the most of a token that may appear in a log line.
func tokenPrefix(s string) string {
	const n = 4
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
