package httpcall_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
	"github.com/agentrunner/runner/adapter/secret"
)

var errMine = errors.New("mine")

const (
	opGet httpcall.Op = 1 << iota
	opPut
)

var table = httpcall.Table{Provider: "p", Rules: []httpcall.Rule{
	{Ops: opGet, Status: []int{404}, Own: httpcall.OwnBody, Kind: adapter.KindNotFound},
	{Status: []int{429}, Kind: adapter.KindRateLimited},
	{Own: httpcall.ForeignBody, Kind: adapter.KindUnavailable},
	{Ops: opPut, Status: []int{409}, Kind: adapter.KindInvalid, Cause: errMine, Note: " (taken)"},
	{Code: []string{"gone"}, Kind: adapter.KindCommandExited},
	{Code: []string{"nope"}, Kind: adapter.KindNotSupported},
	{Min: 500, Own: httpcall.OwnBody, Kind: adapter.KindUnavailable},
}}

func TestTableClassify(t *testing.T) {
	for _, tc := range []struct {
		name  string
		a     httpcall.Answer
		kind  adapter.Kind
		cause bool
	}{
		{"own 404 of a get", httpcall.Answer{Op: opGet, Status: 404, Own: true}, adapter.KindNotFound, false},
		{"own 404 of a put", httpcall.Answer{Op: opPut, Status: 404, Own: true}, adapter.KindProvider, false},
		{"proxy 404 of a get", httpcall.Answer{Op: opGet, Status: 404}, adapter.KindUnavailable, false},
		{"429 of anyone", httpcall.Answer{Op: opPut, Status: 429}, adapter.KindRateLimited, false},
		{"own 409 of a put", httpcall.Answer{Op: opPut, Status: 409, Own: true}, adapter.KindInvalid, true},
		{"own 409 of a get", httpcall.Answer{Op: opGet, Status: 409, Own: true}, adapter.KindProvider, false},
		{"code gone", httpcall.Answer{Op: opGet, Status: 200, Own: true, Code: "gone"}, adapter.KindCommandExited, false},
		{"code nope", httpcall.Answer{Op: opGet, Status: 200, Own: true, Code: "nope"}, adapter.KindNotSupported, false},
		{"own 503", httpcall.Answer{Op: opGet, Status: 503, Own: true}, adapter.KindUnavailable, false},
		{"own 499", httpcall.Answer{Op: opGet, Status: 499, Own: true}, adapter.KindProvider, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.a.Detail = "HTTP x"
			tc.a.RetryAfter = 3 * time.Second
			e := table.Classify(&httpcall.Error{Op: "do it", Status: tc.a.Status}, tc.a)
			if got := adapter.KindOf(e); got != tc.kind || e.Kind() != tc.kind {
				t.Fatalf("got kind %s (%s), want %s", got, e.Kind(), tc.kind)
			}
			if e.Provider != "p" {
				t.Errorf("got provider %q, want p", e.Provider)
			}
			if got := errors.Is(e, errMine); got != tc.cause {
				t.Errorf("errors.Is(cause) = %v, want %v", got, tc.cause)
			}
			var rl *adapter.RateLimitedError
			if errors.As(e, &rl) && rl.RetryAfter != 3*time.Second {
				t.Errorf("got RetryAfter %v, want 3s", rl.RetryAfter)
			}
			if tc.cause && e.Error() != "do it: mine: invalid: HTTP x (taken)" {
				t.Errorf("got %q", e.Error())
			}
		})
	}
}

func TestDetail(t *testing.T) {
	for _, tc := range []struct {
		status        int
		code, message string
		want          string
	}{
		{404, "", "", "HTTP 404"},
		{404, "", "no", "HTTP 404: no"},
		{502, "unavailable", "down", "HTTP 502 unavailable: down"},
		{0, "unknown", "boom", "unknown: boom"},
	} {
		if got := httpcall.Detail(tc.status, tc.code, tc.message); got != tc.want {
			t.Errorf("Detail(%d, %q, %q) = %q, want %q", tc.status, tc.code, tc.message, got, tc.want)
		}
	}
}

// TestTransportErrorHidesURLAndSecrets: a transport failure's text quotes
// the request URL (with an argv in its query) and may echo a secret;
// neither may reach the error.
func TestTransportErrorHidesURLAndSecrets(t *testing.T) {
	key := secret.New("k3y-s3cret")
	u := "http://127.0.0.1:1/exec?cmd=rm+-rf&env=TOKEN%3Dabc"
	cause := &url.Error{Op: "Post", URL: u, Err: errors.New("dial: refused by k3y-s3cret")}
	red := httpcall.Redactor{Secrets: []secret.Secret{key}, Plain: []string{"TOKEN=abc"}}
	err := httpcall.TransportError(context.Background(), "p", "exec", cause, true, red)
	var ue *adapter.UnavailableError
	if !errors.As(err, &ue) || !ue.Uncertain {
		t.Fatalf("got %v, want an uncertain *adapter.UnavailableError", err)
	}
	if s := err.Error(); strings.Contains(s, "cmd=") || strings.Contains(s, "k3y-s3cret") || !strings.Contains(s, secret.Redacted) {
		t.Errorf("got %q: the URL or the key leaked", s)
	}
	if got := red.Clean("x TOKEN=abc y"); got != "x [request] y" {
		t.Errorf("Clean: got %q", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := httpcall.TransportError(ctx, "p", "exec", cause, false, red); !errors.Is(err, context.Canceled) || adapter.Transient(err) {
		t.Errorf("got %v, want the caller's context.Canceled", err)
	}
}
