package standin

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
)

// Routes are a stand-in API's handlers by http.ServeMux pattern
// ("GET /sandboxes/{id}").
type Routes map[string]http.HandlerFunc

// API returns a stand-in's API: its routes behind the credential check.
// A request for which authorized is false gets deny's answer (the
// provider's own 401) and reaches no route; a request no route matches
// gets ServeMux's 404 or 405.
func API(authorized func(*http.Request) bool, deny http.HandlerFunc, routes Routes) http.Handler {
	mux := http.NewServeMux()
	for pattern, h := range routes {
		mux.HandleFunc(pattern, h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !authorized(r) {
			deny(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Bearer returns a check that accepts only "Authorization: Bearer token".
func Bearer(token string) func(*http.Request) bool {
	return HeaderIs("Authorization", "Bearer "+token)
}

// HeaderIs returns a check that accepts only a request whose header name
// is exactly value.
func HeaderIs(name, value string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.Header.Get(name) == value }
}

// Serve starts an httptest server of h behind the switches, named server
// (for DropServer and Requests); limited says whether the rate limit
// applies to it. The caller closes it.
func (f *Faults) Serve(server string, limited bool, h http.Handler) *httptest.Server {
	return httptest.NewServer(f.Wrap(server, limited, h))
}

// QueryLimit reads a list's page size from q[key]: def when absent; ok is
// false when it is not a whole number in 1..max (the provider's 400).
func QueryLimit(q url.Values, key string, def, max int) (n int, ok bool) {
	v := q.Get(key)
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 1 && n <= max
}

// SeqCursor is an opaque list cursor naming the sequence number seq.
func SeqCursor(seq uint64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatUint(seq, 10)))
}

// ParseSeqCursor reads a SeqCursor; an error is the provider's 400.
func ParseSeqCursor(v string) (uint64, error) {
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(b), 10, 64)
}

// WriteList writes a list answer: whole (with contentType when set), or
// cut mid-body when an InterruptList turn is due.
func (f *Faults) WriteList(w http.ResponseWriter, contentType string, v any) {
	if f.TakeInterrupt() {
		WriteCut(w, http.StatusOK, v)
		return
	}
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	WriteJSON(w, http.StatusOK, v)
}
