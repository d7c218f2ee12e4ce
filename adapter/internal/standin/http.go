package standin

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Faults is the fault switchboard in front of a stand-in's HTTP servers.
// Set the exported fields before the first request; the methods are safe
// for concurrent use. A stand-in's Server embeds a *Faults, so its
// switches (SetOutage, SetDropConnections, RateLimit, InterruptList,
// Requests) are the Server's.
type Faults struct {
	// OutageBody is the body of an outage's 503 (default "upstream
	// unavailable"), as the provider's edge words it.
	OutageBody string
	// RateLimited writes the provider's 429 body; Retry-After (whole
	// seconds) is already set. Required when RateLimit is used.
	RateLimited func(w http.ResponseWriter, retryAfter time.Duration)
	// Extra, when not nil, answers the provider's own faults after the
	// outage and drop switches and before the rate limit, and reports
	// whether it answered (a request it answers takes no rate-limit turn).
	Extra func(w http.ResponseWriter, r *http.Request) bool

	mu         sync.Mutex // guards the fields below
	outage     bool
	drop       bool
	dropped    map[string]bool // servers whose connections alone drop
	rateLimit  int
	retryAfter time.Duration
	interrupt  int
	requests   map[string]int
	uris       []string
}

// SetOutage makes every server answer every request 503 while on.
func (f *Faults) SetOutage(on bool) { f.mu.Lock(); f.outage = on; f.mu.Unlock() }

// SetDropConnections makes every server close every connection without
// an answer while on, as a failing proxy does.
func (f *Faults) SetDropConnections(on bool) { f.mu.Lock(); f.drop = on; f.mu.Unlock() }

// DropServer makes the one server named server (as given to Wrap) close
// every connection without an answer while on.
func (f *Faults) DropServer(server string, on bool) {
	f.mu.Lock()
	if f.dropped == nil {
		f.dropped = map[string]bool{}
	}
	f.dropped[server] = on
	f.mu.Unlock()
}

// RateLimit answers the next n rate-limited requests 429 with Retry-After
// in whole seconds.
func (f *Faults) RateLimit(n int, retryAfter time.Duration) {
	f.mu.Lock()
	f.rateLimit, f.retryAfter = n, retryAfter
	f.mu.Unlock()
}

// InterruptList cuts the body of the next n list answers mid-page: the
// status and Content-Length are sent, half the body, then the connection
// is closed (the list handler asks [Faults.TakeInterrupt]).
func (f *Faults) InterruptList(n int) { f.mu.Lock(); f.interrupt = n; f.mu.Unlock() }

// TakeInterrupt reports whether this list answer is to be cut, using up
// one InterruptList turn.
func (f *Faults) TakeInterrupt() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.interrupt > 0 {
		f.interrupt--
		return true
	}
	return false
}

// Requests returns how many requests matched "METHOD /path" (the path
// as received, with ids).
func (f *Faults) Requests(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[key]
}

// RequestURIs returns every request URI as received (path and query).
func (f *Faults) RequestURIs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.uris...)
}

// Wrap puts the switches in front of next, the handler of the server
// named server; limited says whether the rate limit applies to it.
func (f *Faults) Wrap(server string, limited bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		if f.requests == nil {
			f.requests = map[string]int{}
		}
		f.requests[r.Method+" "+r.URL.Path]++
		f.uris = append(f.uris, r.URL.RequestURI())
		drop, outage := f.drop || f.dropped[server], f.outage
		f.mu.Unlock()
		switch {
		case drop:
			Drop(w)
			return
		case outage:
			body := f.OutageBody
			if body == "" {
				body = "upstream unavailable"
			}
			http.Error(w, body, http.StatusServiceUnavailable)
			return
		}
		if f.Extra != nil && f.Extra(w, r) {
			return
		}
		f.mu.Lock()
		take := limited && f.rateLimit > 0
		if take {
			f.rateLimit--
		}
		ra := f.retryAfter
		f.mu.Unlock()
		if take {
			w.Header().Set("Retry-After", strconv.Itoa(int(ra/time.Second)))
			f.RateLimited(w, ra)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Drop closes the request's connection without an answer.
func Drop(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// WriteJSON writes v as a JSON answer with its Content-Length
// (Content-Type application/json unless the caller set one).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	header(w, len(b))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// WriteCut writes v as WriteJSON does, but only half of it, and then
// closes the connection short of its Content-Length: a body cut midway.
func WriteCut(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	header(w, len(b))
	w.WriteHeader(status)
	_, _ = w.Write(b[:len(b)/2])
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
	panic(http.ErrAbortHandler)
}

func header(w http.ResponseWriter, n int) {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Length", strconv.Itoa(n))
}

// RandHex returns n random bytes in hex (ids, tokens, keys).
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
