package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// TestRefused: only a connection nothing accepted is Refused (what runner
// answers "is runnerd running?" to); a runnerd that answered 503, or a
// connection it cut, is unavailable but not refused, and the kind stays
// unavailable either way.
func TestRefused(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runnerdError(w, 503, wire.CodeUnavailable, 0)
	}))
	defer busy.Close()
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	defer cut.Close()

	for _, tc := range []struct {
		name, endpoint string
		refused        bool
	}{
		{"tcp refused", "http://" + closedAddr, true},
		{"no socket", "unix://" + filepath.Join(t.TempDir(), "none.sock"), true},
		{"503 from runnerd", busy.URL, false},
		{"connection cut", cut.URL, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New(tc.endpoint, fakeToken, client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Capabilities(context.Background())
			if !errors.Is(err, adapter.ErrUnavailable) {
				t.Fatalf("got %v, want unavailable", err)
			}
			if got := client.Refused(err); got != tc.refused {
				t.Errorf("Refused(%v) = %v, want %v", err, got, tc.refused)
			}
			var un *adapter.UnavailableError
			if !errors.As(err, &un) {
				t.Errorf("errors.As(*adapter.UnavailableError) failed for %v", err)
			}
		})
	}
}
