package httpcall

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryAfter reads a 429's Retry-After as whole seconds or as an HTTP
// date, for the providers' error tables; zero when absent, unparsable or
// already past (the caller's own backoff then applies).
func RetryAfter(h http.Header) time.Duration {
	if h == nil {
		return 0
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}
