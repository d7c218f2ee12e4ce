package e2b_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
)

const (
	testKey   = "e2b_0123456789abcdef0123456789abcdef"
	testToken = "envd-token-fedcba9876543210"
)

// answer is one canned HTTP answer.
type answer struct {
	status int
	header map[string]string
	body   []byte
}

// canned serves a fixed answer to every request and reports the secrets'
// whereabouts: it echoes both in its messages, as a careless server might.
func canned(t *testing.T, a answer) (*e2b.Client, e2b.Sandbox) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
	}))
	t.Cleanup(srv.Close)
	c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret(testKey), APIURL: srv.URL, SandboxURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, e2b.Sandbox{SandboxID: "isbx", EnvdAccessToken: e2b.NewSecret(testToken)}
}

func jsonBody(v any) []byte { b, _ := json.Marshal(v); return b }

func apiErr(code int, msg string) []byte {
	return jsonBody(map[string]any{"code": code, "message": msg})
}

var jsonType = map[string]string{"Content-Type": "application/json"}

func TestControlPlaneErrorMap(t *testing.T) {
	echo := "key " + testKey + " was wrong"
	for _, tc := range []struct {
		name   string
		a      answer
		delete bool // call Delete instead of Get
		want   adapter.Kind
		retry  time.Duration
	}{
		{"get 404 with the API's body", answer{404, jsonType, apiErr(404, "sandbox x doesn't exist")}, false, adapter.KindNotFound, 0},
		{"get 404 from a proxy", answer{404, nil, []byte("404 page not found")}, false, adapter.KindUnavailable, 0},
		{"get 404 with a foreign JSON body", answer{404, jsonType, jsonBody(map[string]string{"error": "no route"})}, false, adapter.KindUnavailable, 0},
		{"delete 404 with the API's body", answer{404, jsonType, apiErr(404, "sandbox x doesn't exist")}, true, adapter.KindProvider, 0},
		{"delete 204", answer{204, nil, nil}, true, adapter.KindNone, 0},
		{"proxy 502", answer{502, nil, []byte("bad gateway")}, false, adapter.KindUnavailable, 0},
		{"503", answer{503, nil, nil}, false, adapter.KindUnavailable, 0},
		{"500 with the API's body", answer{500, jsonType, apiErr(500, echo)}, false, adapter.KindUnavailable, 0},
		{"429 with Retry-After seconds", answer{429, map[string]string{"Retry-After": "7"}, apiErr(429, "slow down")}, false, adapter.KindRateLimited, 7 * time.Second},
		{"429 without Retry-After", answer{429, nil, nil}, false, adapter.KindRateLimited, 0},
		{"401", answer{401, jsonType, apiErr(401, echo)}, false, adapter.KindDenied, 0},
		{"403", answer{403, jsonType, apiErr(403, "forbidden")}, false, adapter.KindDenied, 0},
		{"400", answer{400, jsonType, apiErr(400, "bad")}, false, adapter.KindInvalid, 0},
		{"409", answer{409, jsonType, apiErr(409, "conflict")}, true, adapter.KindInvalid, 0},
		{"418", answer{418, nil, nil}, false, adapter.KindProvider, 0},
		{"200 that does not parse", answer{200, jsonType, []byte("<html>")}, false, adapter.KindUnavailable, 0},
		{"200 cut mid-object", answer{200, jsonType, []byte(`{"sandboxID":"isb`)}, false, adapter.KindUnavailable, 0},
		{"get 200", answer{200, jsonType, jsonBody(map[string]string{"sandboxID": "isbx"})}, false, adapter.KindNone, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := canned(t, tc.a)
			var err error
			if tc.delete {
				err = c.Delete(t.Context(), "isbx")
			} else {
				_, err = c.Get(t.Context(), "isbx")
			}
			wantKind(t, tc.name, err, tc.want)
			if tc.want == adapter.KindRateLimited {
				var rl *adapter.RateLimitedError
				if !errors.As(err, &rl) || rl.RetryAfter != tc.retry {
					t.Errorf("got %v, want RetryAfter %v", err, tc.retry)
				}
			}
			if err != nil && strings.Contains(err.Error(), testKey) {
				t.Errorf("error text carries the API key: %v", err)
			}
		})
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	when := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	c, _ := canned(t, answer{429, map[string]string{"Retry-After": when}, nil})
	_, err := c.Get(t.Context(), "isbx")
	var rl *adapter.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter < 80*time.Second || rl.RetryAfter > 90*time.Second {
		t.Errorf("got %v, want RetryAfter of about 90s", err)
	}
}

func connectErrBody(code, msg string) []byte {
	return jsonBody(map[string]string{"code": code, "message": msg})
}

func TestEnvdUnaryErrorMap(t *testing.T) {
	echo := "token " + testToken + " rejected"
	for _, tc := range []struct {
		name         string
		a            answer
		want         adapter.Kind
		code         string // the *e2b.Error's Code, "" when a proxy answered
		procNotFound bool
	}{
		{"ok", answer{200, jsonType, []byte(`{"processes":[]}`)}, adapter.KindNone, "", false},
		{"process not found", answer{404, jsonType, connectErrBody("not_found", "process with pid 7 not found")}, adapter.KindProvider, "not_found", true},
		{"proxy 404", answer{404, nil, []byte("404 page not found")}, adapter.KindUnavailable, "", false},
		{"proxy 502", answer{502, nil, []byte("The sandbox was not found")}, adapter.KindUnavailable, "", false},
		{"proxy 502 with a JSON body", answer{502, jsonType, jsonBody(map[string]any{"code": 502, "message": "sandbox not found"})}, adapter.KindUnavailable, "", false},
		{"unavailable", answer{503, jsonType, connectErrBody("unavailable", "")}, adapter.KindUnavailable, "unavailable", false},
		{"deadline exceeded", answer{504, jsonType, connectErrBody("deadline_exceeded", "")}, adapter.KindUnavailable, "deadline_exceeded", false},
		{"unauthenticated", answer{401, jsonType, connectErrBody("unauthenticated", echo)}, adapter.KindDenied, "unauthenticated", false},
		{"proxy 401", answer{401, nil, nil}, adapter.KindDenied, "", false},
		{"permission denied", answer{403, jsonType, connectErrBody("permission_denied", "")}, adapter.KindDenied, "permission_denied", false},
		{"invalid argument", answer{400, jsonType, connectErrBody("invalid_argument", "")}, adapter.KindInvalid, "invalid_argument", false},
		{"failed precondition", answer{400, jsonType, connectErrBody("failed_precondition", "")}, adapter.KindInvalid, "failed_precondition", false},
		{"resource exhausted", answer{429, map[string]string{"Content-Type": "application/json", "Retry-After": "2"}, connectErrBody("resource_exhausted", "")}, adapter.KindRateLimited, "resource_exhausted", false},
		{"internal", answer{500, jsonType, connectErrBody("internal", "error writing to stdin")}, adapter.KindProvider, "internal", false},
		{"unknown", answer{500, jsonType, connectErrBody("unknown", echo)}, adapter.KindProvider, "unknown", false},
		{"unimplemented", answer{501, jsonType, connectErrBody("unimplemented", "")}, adapter.KindNotSupported, "unimplemented", false},
		{"200 of another type", answer{200, map[string]string{"Content-Type": "text/html"}, []byte("<html>")}, adapter.KindUnavailable, "", false},
		{"200 that does not parse", answer{200, jsonType, []byte("{")}, adapter.KindUnavailable, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, sb := canned(t, tc.a)
			_, err := c.Envd(sb).List(t.Context())
			wantKind(t, tc.name, err, tc.want)
			if err == nil {
				return
			}
			var e *e2b.Error
			if !errors.As(err, &e) || e.Code != tc.code {
				t.Errorf("got %#v, want an *e2b.Error with Code %q", err, tc.code)
			}
			if e2b.IsProcessNotFound(err) != tc.procNotFound {
				t.Errorf("IsProcessNotFound = %v, want %v", !tc.procNotFound, tc.procNotFound)
			}
			if errors.Is(err, adapter.ErrNotFound) {
				t.Errorf("envd's answer became adapter.ErrNotFound: %v", err)
			}
			if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), testKey) {
				t.Errorf("error text carries a secret: %v", err)
			}
		})
	}
}

func frame(flags byte, msg []byte) []byte {
	b := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

var streamType = map[string]string{"Content-Type": "application/connect+json"}

func TestEnvdStreamErrorMap(t *testing.T) {
	start := frame(0, []byte(`{"event":{"start":{"pid":42}}}`))
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for _, tc := range []struct {
		name string
		a    answer
		want adapter.Kind // of Start's error, or of Drain's when Start succeeds
	}{
		{"end-stream not_found before start", answer{200, streamType, frame(2, []byte(`{"error":{"code":"not_found","message":"no"}}`))}, adapter.KindProvider},
		{"end-stream resource_exhausted", answer{200, streamType, frame(2, []byte(`{"error":{"code":"resource_exhausted"}}`))}, adapter.KindRateLimited},
		{"end-stream invalid_argument", answer{200, streamType, frame(2, []byte(`{"error":{"code":"invalid_argument"}}`))}, adapter.KindInvalid},
		{"clean end-stream before start", answer{200, streamType, frame(2, []byte(`{}`))}, adapter.KindUnavailable},
		{"body ends before start", answer{200, streamType, nil}, adapter.KindUnavailable},
		{"body cut inside an envelope", answer{200, streamType, start[:7]}, adapter.KindUnavailable},
		{"compressed envelope", answer{200, streamType, frame(1, []byte(`{}`))}, adapter.KindProvider},
		{"unknown flags", answer{200, streamType, frame(0x80, []byte(`{}`))}, adapter.KindProvider},
		{"oversized envelope", answer{200, streamType, []byte{0, 0xff, 0xff, 0xff, 0xff}}, adapter.KindProvider},
		{"end-stream that does not parse", answer{200, streamType, frame(2, []byte(`{`))}, adapter.KindProvider},
		{"end-stream error without a code", answer{200, streamType, frame(2, []byte(`{"error":{}}`))}, adapter.KindProvider},
		{"event that does not parse", answer{200, streamType, frame(0, []byte(`[]`))}, adapter.KindProvider},
		{"output before start", answer{200, streamType, frame(0, []byte(`{"event":{"data":{"stdout":"aGk="}}}`))}, adapter.KindUnavailable},
		{"proxy 502", answer{502, nil, []byte("bad gateway")}, adapter.KindUnavailable},
		{"proxy 429", answer{429, map[string]string{"Retry-After": "1"}, nil}, adapter.KindRateLimited},
		{"unary-style error body", answer{401, jsonType, connectErrBody("unauthenticated", "")}, adapter.KindDenied},
		{"200 of another type", answer{200, jsonType, start}, adapter.KindUnavailable},
		// After the start event, Drain reports how the stream ended.
		{"cut after start", answer{200, streamType, start}, adapter.KindUnavailable},
		{"clean end without an end event", answer{200, streamType, cat(start, frame(2, []byte(`{}`)))}, adapter.KindUnavailable},
		{"deadline after start", answer{200, streamType, cat(start, frame(2, []byte(`{"error":{"code":"deadline_exceeded"}}`)))}, adapter.KindUnavailable},
		{"a second start event", answer{200, streamType, cat(start, start)}, adapter.KindUnavailable},
		{"keepalive, unknown event, end", answer{200, streamType, cat(start,
			frame(0, []byte(`{"event":{"keepalive":{}}}`)),
			frame(0, []byte(`{"event":{"future":{"x":1}}}`)),
			frame(0, []byte(`{"event":{"end":{"exit_code":3,"exited":true,"status":"exit status 3"}}}`)),
			frame(2, []byte(`{"metadata":{"x":["y"]}}`)))}, adapter.KindNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, sb := canned(t, tc.a)
			st, err := c.Envd(sb).Start(t.Context(), argv("true"))
			if err == nil {
				if st.PID() != 42 {
					t.Errorf("pid %d, want 42", st.PID())
				}
				var out e2b.Output
				out, err = st.Drain()
				if err == nil && (out.End.ExitCode != 3 || !out.End.Exited) {
					t.Errorf("end %+v, want exit 3 read from the proto field name", out.End)
				}
			}
			wantKind(t, tc.name, err, tc.want)
		})
	}
}

// TestSecretsStayHidden renders everything that holds a secret every way a
// log line or an error could, and checks the requests' URLs.
func TestSecretsStayHidden(t *testing.T) {
	f := newFixture(t, e2btest.Options{})
	ctx := ctxFor(t)
	sb, err := f.c.Create(ctx, e2b.NewSandbox{TemplateID: "runner", Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	token := sb.EnvdAccessToken.Reveal()
	if token == "" {
		t.Fatal("the stand-in gave no access token")
	}
	key := f.srv.APIKey
	cfg := e2b.Config{APIKey: e2b.NewSecret(key), APIURL: f.srv.URL()}
	envd := f.c.Envd(sb)
	if _, err := envd.List(ctx); err != nil {
		t.Fatal(err)
	}

	var rendered []string
	// *f.c and *envd are dumped by value too: fmt does not call methods on
	// unexported fields, so only Secret's own layout protects them there.
	for _, v := range []any{cfg, &cfg, sb, &sb, f.c, envd, *f.c, *envd, sb.EnvdAccessToken, cfg.APIKey} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X"} {
			rendered = append(rendered, fmt.Sprintf(verb, v))
		}
		b, _ := json.Marshal(v)
		rendered = append(rendered, string(b))
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "v", v)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "v", v)
		rendered = append(rendered, buf.String())
	}
	rendered = append(rendered, f.rec.URLs()...)
	// Errors from every layer: an API error, an envd error, a transport error.
	_, err = f.c.Get(ctx, "nope")
	rendered = append(rendered, fmt.Sprintf("%v %+v %#v", err, err, err))
	err = envd.SendInput(ctx, e2b.Selector{PID: 1}, []byte("x"), false)
	rendered = append(rendered, fmt.Sprintf("%v %+v %#v", err, err, err))
	f.srv.SetDropConnections(true)
	_, err = envd.Start(ctx, argv("true"))
	rendered = append(rendered, fmt.Sprintf("%v %+v %#v", err, err, err))

	for _, s := range rendered {
		hexKey, hexToken := fmt.Sprintf("%x", key), fmt.Sprintf("%x", token)
		if strings.Contains(s, key) || strings.Contains(s, token) || strings.Contains(s, hexKey) || strings.Contains(s, hexToken) {
			t.Errorf("a secret leaked into %q", s)
		}
	}
	if len(f.rec.URLs()) < 3 {
		t.Errorf("recorded %d request URLs; the check saw too few", len(f.rec.URLs()))
	}
}

// TestSecretsRedactedFromServerMessages: a server that echoes the
// credentials in its error messages does not get them into our errors.
func TestSecretsRedactedFromServerMessages(t *testing.T) {
	msg := "bad key " + testKey + " and token " + testToken
	c, sb := canned(t, answer{401, jsonType, connectErrBody("unauthenticated", msg)})
	_, err := c.Envd(sb).List(t.Context())
	var e *e2b.Error
	if !errors.As(err, &e) || !strings.Contains(e.Message, "[redacted]") {
		t.Fatalf("got %#v, want the message kept with the secrets redacted", err)
	}
	if strings.Contains(err.Error(), testToken) || strings.Contains(e.Message, testToken) {
		t.Errorf("the envd token leaked: %v", err)
	}
	c, _ = canned(t, answer{401, jsonType, apiErr(401, msg)})
	_, err = c.Get(t.Context(), "isbx")
	if err == nil || strings.Contains(err.Error(), testKey) {
		t.Errorf("the API key leaked: %v", err)
	}
}

// TestRedirectsAreNotFollowed: Go's client re-sends custom headers to a
// redirect's target, so a redirect (a hijacked DNS name, a misconfigured
// edge) would hand the API key and the envd token to another host.
func TestRedirectsAreNotFollowed(t *testing.T) {
	var mu sync.Mutex
	var leaked []string
	thief := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		leaked = append(leaked, r.Header.Get("X-API-Key")+r.Header.Get("X-Access-Token"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"sandboxID":"isbx","processes":[]}`))
	}))
	t.Cleanup(thief.Close)
	c, sb := canned(t, answer{307, map[string]string{"Location": thief.URL + "/elsewhere"}, nil})
	_, err := c.Get(t.Context(), "isbx")
	wantKind(t, "get answered with a redirect", err, adapter.KindProvider)
	_, err = c.Envd(sb).List(t.Context())
	wantKind(t, "envd answered with a redirect", err, adapter.KindUnavailable)
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) != 0 {
		t.Errorf("the redirect target got %d requests carrying credentials", len(leaked))
	}
}

// TestListAllStopsOnARepeatedCursor: a listing terminates even when the
// server hands back the same cursor forever.
func TestListAllStopsOnARepeatedCursor(t *testing.T) {
	c, _ := canned(t, answer{200, map[string]string{"Content-Type": "application/json", "X-Next-Token": "again"}, []byte(`[{"sandboxID":"isbx"}]`)})
	all, err := c.ListAll(t.Context(), e2b.ListOptions{})
	wantKind(t, "list all with a cursor that repeats", err, adapter.KindUnavailable)
	if all != nil {
		t.Errorf("got %d sandboxes, want none", len(all))
	}
}

// TestWireHeaders pins what goes on the wire for envd and the API.
func TestWireHeaders(t *testing.T) {
	var mu sync.Mutex
	var got []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/connect+json")
		_, _ = w.Write(frame(2, []byte(`{"error":{"code":"internal"}}`)))
	}))
	t.Cleanup(srv.Close)
	c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret(testKey), APIURL: srv.URL, SandboxURL: srv.URL, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	envd := c.Envd(e2b.Sandbox{SandboxID: "isbx", EnvdAccessToken: e2b.NewSecret(testToken)})
	_, _ = envd.Start(t.Context(), argv("true"))
	req := argv("true")
	req.Lifetime = 1500 * time.Millisecond
	_, _ = envd.Start(t.Context(), req)
	_, _ = c.Get(t.Context(), "isbx")

	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("server saw %d requests, want 3", len(got))
	}
	for i, want := range []map[string]string{
		{"Connect-Protocol-Version": "1", "Content-Type": "application/connect+json", "E2b-Sandbox-Id": "isbx",
			"E2b-Sandbox-Port": "49983", "X-Access-Token": testToken, "Keepalive-Ping-Interval": "50",
			"Authorization": "Basic cm9vdDo=", "Connect-Timeout-Ms": "", "X-Api-Key": ""},
		{"Connect-Timeout-Ms": "1500"},
		{"X-Api-Key": testKey, "X-Access-Token": "", "Connect-Protocol-Version": ""},
	} {
		for k, v := range want {
			if g := got[i].Get(k); g != v {
				t.Errorf("request %d header %s = %q, want %q", i, k, g, v)
			}
		}
	}
}
