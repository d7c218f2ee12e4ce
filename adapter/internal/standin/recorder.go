package standin

import (
	"net/http"
	"slices"
	"sync"
	"testing"
)

// Recorder is an http.RoundTripper that keeps the URL of every request it
// sends (WebSocket upgrades included), so a test can prove no secret
// travels in one. It is safe for concurrent use.
type Recorder struct {
	next http.RoundTripper

	mu   sync.Mutex // guards urls
	urls []string
}

// NewRecorder returns a Recorder over a clone of http.DefaultTransport
// whose idle connections close at tb's cleanup.
func NewRecorder(tb testing.TB) *Recorder {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tb.Cleanup(tr.CloseIdleConnections)
	return &Recorder{next: tr}
}

// RoundTrip records req's URL and sends it.
func (r *Recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.urls = append(r.urls, req.URL.String())
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

// URLs returns every URL sent so far, in order.
func (r *Recorder) URLs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.urls)
}
