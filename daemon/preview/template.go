package preview

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// placeholder marks where the token goes in Config.URLTemplate.
const placeholder = "{token}"

// urlTemplate is a validated Config.URLTemplate.
type urlTemplate struct {
	prefix, suffix string // URL(token) = prefix + token + suffix
	scheme         string // "http" or "https"
	hostSuffix     string // lowercase host after the token's label, with its leading dot: ".localhost"
}

// parseTemplate validates a URL template: an absolute http or https URL whose
// host's first label is exactly {token}, followed by at least one more DNS
// label, with an optional port, and no user info, path, query or fragment.
func parseTemplate(s string) (urlTemplate, error) {
	if n := strings.Count(s, placeholder); n != 1 {
		return urlTemplate{}, fmt.Errorf("URL template %q: want %s exactly once, found %d", s, placeholder, n)
	}
	// Substitute a well-formed token so the standard parser checks the rest.
	sample := strings.Repeat("a", TokenLen)
	u, err := url.Parse(strings.Replace(s, placeholder, sample, 1))
	if err != nil {
		return urlTemplate{}, fmt.Errorf("URL template %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return urlTemplate{}, fmt.Errorf("URL template %q: scheme must be http or https", s)
	}
	if u.Opaque != "" || u.User != nil {
		return urlTemplate{}, fmt.Errorf("URL template %q: no user info or opaque part allowed", s)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return urlTemplate{}, fmt.Errorf("URL template %q: a preview is served at the root; no path, query or fragment", s)
	}
	if strings.HasSuffix(u.Host, ":") {
		return urlTemplate{}, fmt.Errorf("URL template %q: empty port", s)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return urlTemplate{}, fmt.Errorf("URL template %q: invalid port %q", s, p)
		}
	}
	host := u.Hostname()
	first, rest, ok := strings.Cut(host, ".")
	if first != sample {
		return urlTemplate{}, fmt.Errorf("URL template %q: %s must be the whole first label of the host", s, placeholder)
	}
	if !ok || rest == "" {
		return urlTemplate{}, fmt.Errorf("URL template %q: the host needs a domain after %s, such as %s.localhost", s, placeholder, placeholder)
	}
	for _, label := range strings.Split(rest, ".") {
		if err := checkLabel(label); err != nil {
			return urlTemplate{}, fmt.Errorf("URL template %q: %w", s, err)
		}
	}
	prefix, suffix, _ := strings.Cut(s, placeholder)
	if u.Path == "" {
		suffix += "/"
	}
	return urlTemplate{
		prefix:     prefix,
		suffix:     suffix,
		scheme:     u.Scheme,
		hostSuffix: "." + strings.ToLower(rest),
	}, nil
}

var errLabel = errors.New("invalid DNS label")

// checkLabel accepts an RFC 1123 host label: 1 to 63 letters, digits and
// hyphens, not starting or ending with a hyphen.
func checkLabel(l string) error {
	if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return fmt.Errorf("%w %q", errLabel, l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return fmt.Errorf("%w %q", errLabel, l)
		}
	}
	return nil
}

// tokenFromHost returns the token a Host header names, or "" when the host is
// not of the form TOKEN + hostSuffix (port ignored, case folded, one trailing
// dot allowed).
func (t urlTemplate) tokenFromHost(hostport string) string {
	host := hostport
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 && !strings.Contains(hostport[i:], "]") {
		host = hostport[:i]
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	tok, ok := strings.CutSuffix(host, t.hostSuffix)
	if !ok || !validToken(tok) {
		return ""
	}
	return tok
}
