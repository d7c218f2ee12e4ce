package standin_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// servers puts two servers behind one switchboard: "api" rate limited,
// "data" not; both answer {"ok":true}, or a cut {"items":[...]} on /list.
func servers(t *testing.T, f *standin.Faults) (api, data *httptest.Server) {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/list" && f.TakeInterrupt() {
			standin.WriteCut(w, http.StatusOK, map[string]any{"items": []string{"aaaaaaaa", "bbbbbbbb"}})
			return
		}
		standin.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	api = httptest.NewServer(f.Wrap("api", true, h))
	data = httptest.NewServer(f.Wrap("data", false, h))
	t.Cleanup(api.Close)
	t.Cleanup(data.Close)
	return api, data
}

func get(t *testing.T, url string) (int, string, http.Header, error) {
	t.Helper()
	// No reused connections: the transport would retry a GET whose
	// connection dropped, and the counts would be the transport's.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	r, err := c.Get(url)
	if err != nil {
		return 0, "", nil, err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	return r.StatusCode, string(b), r.Header, err
}

func TestFaults(t *testing.T) {
	f := &standin.Faults{OutageBody: "edge down",
		RateLimited: func(w http.ResponseWriter, _ time.Duration) {
			standin.WriteJSON(w, http.StatusTooManyRequests, map[string]any{"slow": "down"})
		},
		Extra: func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/teapot" {
				return false
			}
			w.WriteHeader(http.StatusTeapot)
			return true
		}}
	api, data := servers(t, f)

	if code, body, h, err := get(t, api.URL+"/x"); err != nil || code != 200 || body != `{"ok":true}` || h.Get("Content-Type") != "application/json" {
		t.Fatalf("no fault: got %d %q %v %v", code, body, h, err)
	}

	f.SetOutage(true)
	if code, body, _, _ := get(t, data.URL+"/x"); code != 503 || body != "edge down\n" {
		t.Errorf("outage: got %d %q, want 503 %q", code, body, "edge down\n")
	}
	f.SetOutage(false)

	f.RateLimit(2, 3*time.Second)
	// The provider's own fault takes no turn; the unlimited server none.
	if code, _, _, _ := get(t, api.URL+"/teapot"); code != http.StatusTeapot {
		t.Errorf("extra: got %d, want 418", code)
	}
	if code, _, _, _ := get(t, data.URL+"/x"); code != 200 {
		t.Errorf("unlimited server: got %d, want 200", code)
	}
	for i := range 2 {
		code, body, h, _ := get(t, api.URL+"/x")
		if code != 429 || h.Get("Retry-After") != "3" || body != `{"slow":"down"}` {
			t.Errorf("limited %d: got %d %q Retry-After %q", i, code, body, h.Get("Retry-After"))
		}
	}
	if code, _, _, _ := get(t, api.URL+"/x"); code != 200 {
		t.Errorf("after the limit: got %d, want 200", code)
	}

	f.DropServer("data", true)
	if _, _, _, err := get(t, data.URL+"/x"); err == nil {
		t.Error("dropped server answered")
	}
	if code, _, _, err := get(t, api.URL+"/x"); err != nil || code != 200 {
		t.Errorf("the other server: got %d %v, want 200", code, err)
	}
	f.DropServer("data", false)
	f.SetDropConnections(true)
	if _, _, _, err := get(t, api.URL+"/x"); err == nil {
		t.Error("drop all: the api answered")
	}
	f.SetDropConnections(false)

	f.InterruptList(1)
	code, body, _, err := get(t, api.URL+"/list")
	if code != 200 || !errors.Is(err, io.ErrUnexpectedEOF) || !strings.HasPrefix(`{"items":["aaaaaaaa","bbbbbbbb"]}`, body) || len(body) >= 30 {
		t.Errorf("cut list: got %d %q %v, want 200, half the body, unexpected EOF", code, body, err)
	}
	if code, body, _, err := get(t, api.URL+"/list"); err != nil || code != 200 || body != `{"ok":true}` {
		t.Errorf("second list: got %d %q %v, want whole", code, body, err)
	}

	if n := f.Requests("GET /x"); n != 9 {
		t.Errorf("Requests: got %d, want 10", n)
	}
	if uris := f.RequestURIs(); len(uris) != 12 || uris[0] != "/x" {
		t.Errorf("RequestURIs: got %v", uris)
	}
}
