package client_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/wire"
)

// TestTokenNeverPrints formats every value that holds the token, and the
// errors of failing calls, under every verb, and checks that the token
// travels only in the Authorization header, never in a URL.
func TestTokenNeverPrints(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.String(), fakeToken) || strings.Contains(r.RequestURI, fakeToken) {
			t.Errorf("token in the request URL %s", r.RequestURI)
		}
		if r.Header.Get("Authorization") != "Bearer "+fakeToken {
			t.Errorf("Authorization = %q, want the bearer token", r.Header.Get("Authorization"))
		}
		if r.URL.Path == "/v1/capabilities" {
			w.Write([]byte(`{"capabilities":["attach"]}`))
			return
		}
		runnerdError(w, 401, wire.CodeDenied, 0)
	})
	url := serve(t, mux.ServeHTTP)
	c := newTestClient(t, url)
	a, err := client.NewAdapter(context.Background(), c, client.AdapterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := client.NewPool(context.Background(), []client.Endpoint{{Name: "r1", URL: url, Token: fakeToken}}, client.AdapterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	t.Setenv(client.EnvURL, url)
	t.Setenv(client.EnvToken, fakeToken)
	local, err := client.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if local.Token() != fakeToken {
		t.Errorf("Discover token differs from RUNNERD_TOKEN")
	}
	h := adapter.Handle{Provider: "runner", Name: "web-1", ID: "i1", Private: adapter.NewPrivate(fakeToken)}
	ctx := context.Background()
	_, err1 := a.Get(ctx, "web-1")
	_, err2 := c.Exec(ctx, "web-1", wire.Exec{Argv: []string{"true"}})
	_, err3 := c.Attach(ctx, "web-1", "s1", client.Cursors{})
	_, err4 := pool.Create(ctx, "r1-x", adapter.CreateOptions{})
	bad := newTestClient(t, "http://127.0.0.1:1")
	_, err5 := bad.GetSandbox(ctx, "web-1")
	values := []any{c, a, pool, local, h, client.Endpoint{Name: "r1", URL: url, Token: fakeToken}, err1, err2, err3, err4, err5,
		[]any{c, a}, map[string]any{"c": c}, struct{ C *client.Client }{c}}
	for _, v := range values {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
			if s := fmt.Sprintf(verb, v); strings.Contains(s, fakeToken) {
				t.Errorf("%s of %T prints the token: %s", verb, v, s)
			}
		}
	}
	for i, err := range []error{err1, err2, err3, err4} {
		if adapter.KindOf(err) != adapter.KindDenied {
			t.Errorf("call %d = %v, want denied", i+1, err)
		}
	}
}
