package daytona_test

import (
	"bytes"
	"context"
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
	"github.com/agentrunner/runner/adapter/daytona"
)

// canned answers one status, headers and body to every request.
type canned struct {
	status int
	header map[string]string
	body   string
}

func apiBody(status int, msg string) string {
	return fmt.Sprintf(`{"statusCode":%d,"message":%q,"error":"x"}`, status, msg)
}

func daemonBody(status int, msg string) string {
	return fmt.Sprintf(`{"statusCode":%d,"message":%q,"code":"X","path":"/p","method":"GET"}`, status, msg)
}

// call is one client call, against a server that answers everything.
type call struct {
	name string
	do   func(ctx context.Context, c *daytona.Client, tb *daytona.Toolbox) error
}

var (
	getCall = call{"get", func(ctx context.Context, c *daytona.Client, _ *daytona.Toolbox) error {
		_, err := c.Get(ctx, "sb")
		return err
	}}
	createCall = call{"create", func(ctx context.Context, c *daytona.Client, _ *daytona.Toolbox) error {
		_, err := c.Create(ctx, daytona.CreateSandbox{Name: "sb"})
		return err
	}}
	deleteCall = call{"delete", func(ctx context.Context, c *daytona.Client, _ *daytona.Toolbox) error {
		return c.Delete(ctx, "sb")
	}}
	stopCall = call{"stop", func(ctx context.Context, c *daytona.Client, _ *daytona.Toolbox) error {
		return c.Stop(ctx, "sb")
	}}
	listCall = call{"list", func(ctx context.Context, c *daytona.Client, _ *daytona.Toolbox) error {
		_, err := c.List(ctx, daytona.ListOptions{})
		return err
	}}
	inputCall = call{"input", func(ctx context.Context, _ *daytona.Client, tb *daytona.Toolbox) error {
		return tb.SendInput(ctx, "s", "c", "x")
	}}
	execCall = call{"exec", func(ctx context.Context, _ *daytona.Client, tb *daytona.Toolbox) error {
		_, err := tb.Exec(ctx, "s", "true", true)
		return err
	}}
	sessionCall = call{"create session", func(ctx context.Context, _ *daytona.Client, tb *daytona.Toolbox) error {
		return tb.CreateSession(ctx, "s")
	}}
	logsCall = call{"logs", func(ctx context.Context, _ *daytona.Client, tb *daytona.Toolbox) error {
		_, err := tb.Logs(ctx, "s", "c", false)
		return err
	}}
	uploadCall = call{"upload", func(ctx context.Context, _ *daytona.Client, tb *daytona.Toolbox) error {
		return tb.Upload(ctx, "f", []byte("x"))
	}}
	downloadCall = call{"download", func(ctx context.Context, _ *daytona.Client, tb *daytona.Toolbox) error {
		_, err := tb.Download(ctx, "f")
		return err
	}}
	deleteSessionCall = call{"delete session", func(ctx context.Context, _ *daytona.Client, tb *daytona.Toolbox) error {
		return tb.DeleteSession(ctx, "s")
	}}
)

// wrapped500 is the body the toolbox daemon answers for an error its
// handler wrapped (common-go's default handler: no code, a zero
// timestamp, an empty path), as daemon v0.190.0 answers it.
func wrapped500(msg string) string {
	return fmt.Sprintf(`{"statusCode":500,"message":%q,"timestamp":"0001-01-01T00:00:00Z","path":""}`, msg)
}

// cannedClient is a client and a toolbox whose API and toolbox proxy are
// the server at u.
func cannedClient(t *testing.T, u string) (*daytona.Client, *daytona.Toolbox) {
	t.Helper()
	c, err := daytona.New(daytona.Config{APIKey: daytona.NewSecret("key"), APIURL: u})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := c.Toolbox(testCtx(t), daytona.Sandbox{ID: "sb", ToolboxProxyURL: u + "/toolbox"})
	if err != nil {
		t.Fatal(err)
	}
	return c, tb
}

// TestErrorMap drives every mapping rule through a real HTTP answer.
func TestErrorMap(t *testing.T) {
	cases := []struct {
		name    string
		call    call
		answer  canned
		kind    adapter.Kind
		check   func(error) bool // extra assertion; nil: none
		checkIs string
	}{
		{"get 404 with the API body is not_found", getCall, canned{404, nil, apiBody(404, "Sandbox with ID or name sb not found")}, adapter.KindNotFound, nil, ""},
		{"get 404 without a body is a proxy", getCall, canned{404, nil, "404 page not found"}, adapter.KindUnavailable, nil, ""},
		{"get 404 with a body naming another status", getCall, canned{404, nil, apiBody(500, "x")}, adapter.KindUnavailable, nil, ""},
		{"get 404 JSON without statusCode", getCall, canned{404, nil, `{"message":"not found"}`}, adapter.KindUnavailable, nil, ""},
		{"delete 404 with the API body", deleteCall, canned{404, nil, apiBody(404, "not found")}, adapter.KindProvider, nil, ""},
		{"stop 404 with the API body", stopCall, canned{404, nil, apiBody(404, "not found")}, adapter.KindProvider, nil, ""},
		{"create 409 is name taken", createCall, canned{409, nil, apiBody(409, "exists")}, adapter.KindInvalid,
			func(err error) bool { return errors.Is(err, daytona.ErrNameTaken) }, "ErrNameTaken"},
		{"delete 409 is not name taken", deleteCall, canned{409, nil, apiBody(409, "busy")}, adapter.KindInvalid,
			func(err error) bool { return !errors.Is(err, daytona.ErrNameTaken) }, "not ErrNameTaken"},
		{"429 with seconds", getCall, canned{429, map[string]string{"Retry-After": "7"}, apiBody(429, "slow")}, adapter.KindRateLimited,
			func(err error) bool {
				var rl *adapter.RateLimitedError
				return errors.As(err, &rl) && rl.RetryAfter == 7*time.Second
			}, "RetryAfter 7s"},
		{"429 with a date", getCall, canned{429, map[string]string{"Retry-After": time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)}, "slow"}, adapter.KindRateLimited,
			func(err error) bool {
				var rl *adapter.RateLimitedError
				return errors.As(err, &rl) && rl.RetryAfter > 60*time.Second && rl.RetryAfter <= 90*time.Second
			}, "RetryAfter about 90s"},
		{"429 without Retry-After", listCall, canned{429, nil, ""}, adapter.KindRateLimited, nil, ""},
		{"401", getCall, canned{401, nil, apiBody(401, "Unauthorized")}, adapter.KindDenied, nil, ""},
		{"403 from a proxy", getCall, canned{403, nil, "forbidden"}, adapter.KindDenied, nil, ""},
		{"400 with the API body", createCall, canned{400, nil, `{"statusCode":400,"message":["cpu must be positive","x"],"error":"Bad Request"}`}, adapter.KindInvalid, nil, ""},
		{"400 from a proxy", createCall, canned{400, nil, "<html>bad</html>"}, adapter.KindUnavailable, nil, ""},
		{"500 with the API body", getCall, canned{500, nil, apiBody(500, "Internal server error")}, adapter.KindProvider, nil, ""},
		{"500 page", getCall, canned{500, nil, "<html>oops</html>"}, adapter.KindUnavailable, nil, ""},
		{"502 from the proxy", execCall, canned{502, nil, "502 Bad Gateway"}, adapter.KindUnavailable, nil, ""},
		{"503", listCall, canned{503, nil, "down"}, adapter.KindUnavailable, nil, ""},
		{"504 with a body", getCall, canned{504, nil, apiBody(504, "timeout")}, adapter.KindUnavailable, nil, ""},
		{"302 is not followed", getCall, canned{302, map[string]string{"Location": "http://127.0.0.1:1/x"}, ""}, adapter.KindUnavailable, nil, ""},
		{"200 with garbage", getCall, canned{200, nil, "{not json"}, adapter.KindUnavailable, nil, ""},
		{"toolbox 410 is command_exited", inputCall, canned{410, nil, daemonBody(410, "command has already completed with exit code 0")}, adapter.KindCommandExited, nil, ""},
		{"toolbox 410 from a proxy", inputCall, canned{410, nil, "gone"}, adapter.KindUnavailable, nil, ""},
		{"toolbox 404 is the daemon's, not the sandbox's", execCall, canned{404, nil, daemonBody(404, "session not found")}, adapter.KindProvider,
			daytona.IsToolboxNotFound, "IsToolboxNotFound"},
		{"toolbox 404 from a proxy", logsCall, canned{404, nil, "no route"}, adapter.KindUnavailable,
			func(err error) bool { return !daytona.IsToolboxNotFound(err) }, "not IsToolboxNotFound"},
		{"toolbox 409 on session create", sessionCall, canned{409, nil, daemonBody(409, "session already exists")}, adapter.KindInvalid,
			daytona.IsSessionExists, "IsSessionExists"},
		{"toolbox 500 with the daemon body", inputCall, canned{500, nil, daemonBody(500, "failed to open input pipe")}, adapter.KindProvider, nil, ""},
		{"toolbox 408", execCall, canned{408, nil, daemonBody(408, "command execution timeout")}, adapter.KindUnavailable, nil, ""},
		{"exec 202 without cmdId", execCall, canned{202, nil, `{}`}, adapter.KindUnavailable, nil, ""},
		// The daemon's answers as v0.190.0 gives them.
		{"upload failure: 400, no body", uploadCall, canned{400, nil, ""}, adapter.KindInvalid, nil, ""},
		{"bad exec request: 400, no body", execCall, canned{400, nil, ""}, adapter.KindInvalid, nil, ""},
		{"missing download: 404, no body", downloadCall, canned{404, nil, ""}, adapter.KindInvalid,
			daytona.IsToolboxNotFound, "IsToolboxNotFound"},
		{"unknown route: gin's 404 page", logsCall, canned{404, map[string]string{"Content-Type": "text/plain"}, "404 page not found"}, adapter.KindProvider,
			func(err error) bool { return !daytona.IsToolboxNotFound(err) }, "not IsToolboxNotFound"},
		{"exec in an unknown session: a wrapped 500", execCall, canned{500, nil, wrapped500("failed to execute command: not found: session not found")}, adapter.KindProvider,
			daytona.IsToolboxNotFound, "IsToolboxNotFound"},
		{"exec in a session whose shell exited: a wrapped bad request", execCall, canned{500, nil, wrapped500("failed to execute command: bad request: failed to write command: write |1: broken pipe")}, adapter.KindInvalid, nil, ""},
		{"exec with a taken command id: a wrapped conflict", execCall, canned{500, nil, wrapped500("failed to execute command: conflict: command with the given ID already exists")}, adapter.KindInvalid, nil, ""},
		{"delete of an unknown session: not found prefix", deleteSessionCall, canned{404, nil, daemonBody(404, "not found: session not found")}, adapter.KindProvider,
			daytona.IsToolboxNotFound, "IsToolboxNotFound"},
		{"session taken: conflict prefix", sessionCall, canned{409, nil, daemonBody(409, "conflict: session already exists")}, adapter.KindInvalid,
			daytona.IsSessionExists, "IsSessionExists"},
		{"input to an exited session shell: gone prefix", inputCall, canned{410, nil, daemonBody(410, "gone: session process has exited")}, adapter.KindCommandExited, nil, ""},
		{"a 500 of the daemon's own, no prefix", logsCall, canned{500, nil, wrapped500("failed to read log: EIO")}, adapter.KindProvider, nil, ""},
		{"a 500 without a body is not the daemon's", logsCall, canned{500, nil, ""}, adapter.KindUnavailable, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.answer.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.answer.status)
				fmt.Fprint(w, tc.answer.body)
			}))
			defer hs.Close()
			c, tb := cannedClient(t, hs.URL)
			err := tc.call.do(testCtx(t), c, tb)
			if err == nil {
				t.Fatalf("got no error")
			}
			wantKind(t, err, tc.kind)
			if tc.check != nil && !tc.check(err) {
				t.Fatalf("%v: want %s", err, tc.checkIs)
			}
			if tc.kind != adapter.KindNotFound && errors.Is(err, adapter.ErrNotFound) {
				t.Fatalf("%v is ErrNotFound", err)
			}
		})
	}
}

func TestRedirectNotFollowed(t *testing.T) {
	var mu sync.Mutex
	var leaked []string
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		leaked = append(leaked, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, `{"id":"x","state":"started"}`)
	}))
	defer target.Close()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer hs.Close()
	c, _ := daytona.New(daytona.Config{APIKey: daytona.NewSecret("sekrit-key"), APIURL: hs.URL})
	_, err := c.Get(testCtx(t), "sb")
	wantKind(t, err, adapter.KindUnavailable)
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) != 0 {
		t.Fatalf("the redirect was followed, carrying %q", leaked)
	}
}

// TestSecretsNeverShow looks for the key in every rendering of the
// package's values and errors, and in what reaches the server's URLs.
func TestSecretsNeverShow(t *testing.T) {
	const key = "dtn_TOPSECRET_0123456789"
	var mu sync.Mutex
	var uris []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		uris = append(uris, r.RequestURI)
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+key {
			t.Errorf("Authorization: got %q", r.Header.Get("Authorization"))
		}
		// A server that quotes the credential back in its message.
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"statusCode":400,"message":"bad token %s"}`, key)
	}))
	defer hs.Close()
	cfg := daytona.Config{APIKey: daytona.NewSecret(key), APIURL: hs.URL}
	c, err := daytona.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	tb, err := c.Toolbox(ctx, daytona.Sandbox{ID: "sb", ToolboxProxyURL: hs.URL + "/tb"})
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	_, err = c.Get(ctx, "sb")
	errs = append(errs, err)
	_, err = c.List(ctx, daytona.ListOptions{Labels: map[string]string{"a": "b"}})
	errs = append(errs, err)
	errs = append(errs, tb.SendInput(ctx, "s", "c", "x"))
	_, err = tb.Execute(ctx, daytona.ExecuteRequest{Command: "true"})
	errs = append(errs, err)
	// A transport failure quotes the URL.
	dead, _ := daytona.New(daytona.Config{APIKey: daytona.NewSecret(key), APIURL: "http://127.0.0.1:1"})
	_, err = dead.Get(ctx, "sb")
	errs = append(errs, err)

	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, nil))
	for _, v := range []any{cfg, &cfg, c, tb, cfg.APIKey} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
			fmt.Fprintf(&out, verb+"\n", v)
		}
		log.Info("value", "v", v)
		b, _ := json.Marshal(v)
		out.Write(b)
	}
	for _, e := range errs {
		if e == nil {
			t.Fatalf("a call did not fail")
		}
		var de *daytona.Error
		if errors.As(e, &de) {
			fmt.Fprintf(&out, "%v %+v %#v %s\n", e, de, de, de.Message)
		} else {
			fmt.Fprintf(&out, "%v %#v\n", e, e)
		}
		log.Error("call failed", "err", e)
	}
	if strings.Contains(out.String(), key) {
		t.Fatalf("the key shows in:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "bad token [redacted]") {
		t.Fatalf("the server's message was not kept (redacted):\n%s", out.String())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, u := range uris {
		if strings.Contains(u, key) {
			t.Fatalf("the key is in a URL: %s", u)
		}
	}
	if len(uris) != 4 {
		t.Fatalf("got %d requests, want 4", len(uris))
	}
}

func TestNewRefuses(t *testing.T) {
	cases := []daytona.Config{
		{},
		{APIKey: daytona.NewSecret("k"), APIURL: "ftp://x"},
		{APIKey: daytona.NewSecret("k"), APIURL: "http://user:pw@host"},
		{APIKey: daytona.NewSecret("k"), APIURL: "://"},
	}
	for i, cfg := range cases {
		if _, err := daytona.New(cfg); !errors.Is(err, adapter.ErrInvalid) {
			t.Fatalf("case %d: got %v, want invalid", i, err)
		}
	}
	c, _ := daytona.New(daytona.Config{APIKey: daytona.NewSecret("k")})
	if c.String() != "daytona.Client{"+daytona.DefaultAPIURL+"}" {
		t.Fatalf("default API URL: got %s", c)
	}
	// A toolbox proxy URL from an answer must be http(s).
	_, err := c.Toolbox(testCtx(t), daytona.Sandbox{ID: "x", ToolboxProxyURL: "file:///etc"})
	wantKind(t, err, adapter.KindInvalid)
}

// TestCommandReadRetried: a read of a command record that meets the
// daemon's exit-code race (500 "failed to convert exit code to int") is
// read again, bounded: six reads, then the error in its kind; a read that
// succeeds on the third answers. A wrapped typed error (a 404) is not
// retried.
func TestCommandReadRetried(t *testing.T) {
	race := wrapped500(`failed to convert exit code to int: strconv.Atoi: parsing "": invalid syntax`)
	cases := []struct {
		name   string
		fail   int // answers before a success; -1: never
		body   string
		status int
		reads  int
		kind   adapter.Kind // "" for success
	}{
		{"race then success", 2, race, 500, 3, ""},
		{"race every time", -1, race, 500, 6, adapter.KindProvider},
		{"a 404 is not retried", -1, daemonBody(404, "not found: command not found"), 404, 1, adapter.KindProvider},
		{"a proxy's 500 is not retried", -1, "<html>oops</html>", 500, 1, adapter.KindUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			reads := 0
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				reads++
				n := reads
				mu.Unlock()
				if tc.fail < 0 || n <= tc.fail {
					w.WriteHeader(tc.status)
					fmt.Fprint(w, tc.body)
					return
				}
				fmt.Fprint(w, `{"id":"c","command":"true","exitCode":3}`)
			}))
			defer hs.Close()
			_, tb := cannedClient(t, hs.URL)
			cmd, err := tb.Command(testCtx(t), "s", "c")
			if tc.kind == "" {
				if err != nil || cmd.ExitCode == nil || *cmd.ExitCode != 3 {
					t.Fatalf("Command = %+v, %v; want exit code 3", cmd, err)
				}
			} else {
				wantKind(t, err, tc.kind)
			}
			mu.Lock()
			defer mu.Unlock()
			if reads != tc.reads {
				t.Fatalf("reads = %d, want %d", reads, tc.reads)
			}
		})
	}
}
