package httpcall_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
	"github.com/agentrunner/runner/adapter/secret"
)

const key = "sk-live-0123456789"

// caller is a Caller of provider "p" at base whose failed answers are
// *adapter.ProviderError quoting the (redacted) body.
func caller(base string) *httpcall.Caller {
	k := secret.New(key)
	return &httpcall.Caller{
		Provider: "p",
		Base:     base,
		Accept:   "application/json",
		Client:   httpcall.NewClient(nil),
		Header:   func(h http.Header) { h.Set("X-API-Key", k.Reveal()) },
		Secrets:  []secret.Secret{k},
		Fail: func(r *httpcall.Request, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
			return httpcall.NewError("p", r.Op, status, &adapter.ProviderError{Provider: "p", Detail: red.Clean(string(raw))})
		},
	}
}

func TestCallerSendsAndDecodes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != key || r.Header.Get("Accept") != "application/json" ||
			r.Header.Get("Content-Type") != "application/json" || r.URL.RawQuery != "a=1" {
			http.Error(w, "bad request to "+r.URL.String()+" with "+r.Header.Get("X-API-Key"), http.StatusTeapot)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"x"}`))
	}))
	t.Cleanup(srv.Close)
	c := caller(srv.URL)
	var out struct{ ID string }
	rep, err := c.JSON(context.Background(), &httpcall.Request{Op: "make x", Method: http.MethodPost, URL: "/things",
		Query: map[string][]string{"a": {"1"}}, JSON: map[string]int{"n": 1}, OK: []int{http.StatusCreated}}, &out)
	if err != nil || out.ID != "x" || rep.Status != http.StatusCreated {
		t.Fatalf("got %+v %v %v, want id x, 201", out, rep.Status, err)
	}
	// A status outside OK goes to Fail, with the secret out of its text.
	_, err = c.JSON(context.Background(), &httpcall.Request{Op: "make y", Method: http.MethodPost, URL: "/things", OK: []int{http.StatusOK}}, &out)
	var e *httpcall.Error
	if !errors.As(err, &e) || e.Status != http.StatusTeapot || e.Provider != "p" || adapter.KindOf(err) != adapter.KindProvider {
		t.Fatalf("got %v, want p's 418 of kind provider", err)
	}
	if strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), secret.Redacted) {
		t.Errorf("got %q: the key leaked or was not redacted", err)
	}
}

func TestCallerUndecodableIsUnavailable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"id":`))
	}))
	t.Cleanup(srv.Close)
	var out struct{ ID string }
	_, err := caller(srv.URL).JSON(context.Background(), &httpcall.Request{Op: "get x", Method: http.MethodGet, URL: "/x"}, &out)
	if !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("got %v, want unavailable", err)
	}
}

// TestCallerBodyCutIsATransportFailure: an answer whose connection drops
// mid-body is no answer: unavailable, never judged by its status.
func TestCallerBodyCutIsATransportFailure(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(100))
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":"sprite not`))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	_, err := caller(srv.URL).Do(context.Background(), &httpcall.Request{Op: "get x", Method: http.MethodGet, URL: "/x", Uncertain: true})
	var ue *adapter.UnavailableError
	if !errors.As(err, &ue) || !ue.Uncertain {
		t.Fatalf("got %v, want an uncertain unavailable", err)
	}
}

// TestCallerNeverFollowsARedirect: Go re-sends custom headers such as
// X-API-Key to wherever a redirect points; the caller must treat a 3xx
// as the answer, and the other host must see nothing.
func TestCallerNeverFollowsARedirect(t *testing.T) {
	var stolen atomic.Int32
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != "" {
			stolen.Add(1)
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(evil.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, evil.URL+"/take", http.StatusFound)
	}))
	t.Cleanup(srv.Close)
	_, err := caller(srv.URL).Do(context.Background(), &httpcall.Request{Op: "get x", Method: http.MethodGet, URL: "/x"})
	var e *httpcall.Error
	if !errors.As(err, &e) || e.Status != http.StatusFound {
		t.Errorf("got %v, want the 302 as the answer", err)
	}
	if n := stolen.Load(); n != 0 {
		t.Errorf("the key went to the redirect's host %d times", n)
	}
}
