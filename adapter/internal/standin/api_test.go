package standin_test

import (
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// TestAPIChecksTheCredentialBeforeAnyRoute: a request without the one
// credential gets the provider's denial and reaches no handler; with it,
// the route answers, and an unknown route is ServeMux's 404.
func TestAPIChecksTheCredentialBeforeAnyRoute(t *testing.T) {
	f := &standin.Faults{}
	reached := 0
	srv := f.Serve("api", false, standin.API(standin.Bearer("tok"), func(w http.ResponseWriter, _ *http.Request) {
		standin.WriteJSON(w, http.StatusUnauthorized, map[string]any{"error": "no"})
	}, standin.Routes{
		"GET /things/{id}": func(w http.ResponseWriter, r *http.Request) {
			reached++
			standin.WriteJSON(w, http.StatusOK, map[string]any{"id": r.PathValue("id")})
		},
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name, auth, path string
		status           int
		body             string
	}{
		{"no credential", "", "/things/a", 401, `{"error":"no"}`},
		{"wrong credential", "Bearer nope", "/things/a", 401, `{"error":"no"}`},
		{"right credential", "Bearer tok", "/things/a", 200, `{"id":"a"}`},
		{"unknown route", "Bearer tok", "/other", 404, "404 page not found\n"},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || string(b) != tc.body {
			t.Errorf("%s: got %d %q, want %d %q", tc.name, resp.StatusCode, b, tc.status, tc.body)
		}
	}
	if reached != 1 || f.Requests("GET /things/a") != 3 {
		t.Errorf("got %d handler calls and %d counted requests, want 1 and 3", reached, f.Requests("GET /things/a"))
	}
}

func TestQueryLimitAndSeqCursor(t *testing.T) {
	for _, tc := range []struct {
		v  string
		n  int
		ok bool
	}{
		{"", 50, true}, {"1", 1, true}, {"500", 500, true}, {"0", 0, false}, {"501", 501, false}, {"x", 0, false},
	} {
		q := url.Values{}
		if tc.v != "" {
			q.Set("max", tc.v)
		}
		if n, ok := standin.QueryLimit(q, "max", 50, 500); n != tc.n || ok != tc.ok {
			t.Errorf("QueryLimit(%q) = %d, %v; want %d, %v", tc.v, n, ok, tc.n, tc.ok)
		}
	}
	if got, err := standin.ParseSeqCursor(standin.SeqCursor(42)); got != 42 || err != nil {
		t.Errorf("round trip: got %d, %v", got, err)
	}
	if _, err := standin.ParseSeqCursor("!!"); err == nil {
		t.Error("a cursor that is not base64 parsed")
	}
}
