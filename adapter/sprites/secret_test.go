package sprites_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

// TestTokenStaysSecret drives every call, failures included, and looks for
// the token everywhere it must not be: the URLs the client sent (the
// WebSocket upgrade included), the URIs the server received, every error,
// every rendering of the client and its config.
func TestTokenStaysSecret(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	tok := f.srv.Token
	ctx := ctxFor(t)
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	mustCreate(t, f, "sec")
	_, err := f.c.Create(ctx, sprites.CreateRequest{Name: "sec"})
	note(err)
	_, err = f.c.Get(ctx, "absent")
	note(err)
	_, err = f.c.List(ctx, sprites.ListOptions{MaxResults: 1})
	note(err)
	_, err = f.c.WriteFile(ctx, "sec", "/f", []byte("x"), 0o600)
	note(err)
	_, err = f.c.ReadFile(ctx, "sec", "/missing")
	note(err)
	note(f.c.SetNetworkPolicy(ctx, "sec", sprites.NetworkPolicy{}))
	_, err = f.c.Run(ctx, "sec", sprites.ExecOptions{Argv: []string{"true"}}, []byte("in"))
	note(err)
	_, err = f.c.ListSessions(ctx, "absent")
	note(err)
	_, err = f.c.Kill(ctx, "sec", "999999999", "TERM", time.Second)
	note(err)
	f.srv.SetDropExit(spritestest.DropExitAlways)
	_, err = f.c.Run(ctx, "sec", sprites.ExecOptions{Argv: []string{"true"}}, nil)
	note(err)
	f.srv.SetDropConnections(true)
	_, err = f.c.Exec(ctx, "sec", sprites.ExecOptions{Argv: []string{"true"}})
	note(err)
	_, err = f.c.Get(ctx, "sec")
	note(err)
	f.srv.SetDropConnections(false)
	f.srv.SetProxyError(true)
	_, err = f.c.Exec(ctx, "sec", sprites.ExecOptions{Argv: []string{"true"}})
	note(err)

	if len(errs) < 6 {
		t.Fatalf("only %d failures were produced; the test would prove little", len(errs))
	}
	for _, e := range errs {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			if s := fmt.Sprintf(verb, e); strings.Contains(s, tok) {
				t.Errorf("error %s leaks the token: %s", verb, s)
			}
		}
	}
	sawUpgrade := false
	for _, u := range f.rec.URLs() {
		if strings.Contains(u, tok) {
			t.Errorf("client URL carries the token: %s", u)
		}
		sawUpgrade = sawUpgrade || strings.Contains(u, "/exec?")
	}
	if !sawUpgrade {
		t.Error("no WebSocket upgrade went through the recorder; the URL check is incomplete")
	}
	for _, u := range f.srv.RequestURIs() {
		if strings.Contains(u, tok) {
			t.Errorf("server received the token in a URI: %s", u)
		}
	}

	cfg := sprites.Config{Token: sprites.NewSecret(tok), BaseURL: f.srv.URL()}
	for _, v := range []any{cfg, &cfg, f.c, cfg.Token} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
			if s := fmt.Sprintf(verb, v); strings.Contains(s, tok) || strings.Contains(s, fmt.Sprintf("%x", tok)) {
				t.Errorf("%s of %T leaks the token: %s", verb, v, s)
			}
		}
	}
	b, _ := json.Marshal(cfg)
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("cfg", "cfg", cfg, "token", cfg.Token)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("cfg", "cfg", cfg, "token", cfg.Token)
	for what, s := range map[string]string{"json": string(b), "slog": buf.String()} {
		if strings.Contains(s, tok) {
			t.Errorf("%s leaks the token: %s", what, s)
		}
	}
}

// TestErrorsScrubEchoes: a server that echoes the token (and a dial error
// that would quote the exec URL) must not carry them into errors.
func TestErrorsScrubEchoes(t *testing.T) {
	const tok = "tok-echoed-back-0123456789"
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":"bad %s","message":"you sent %s at %s"}`, r.Header.Get("Authorization"), r.Header.Get("Authorization"), r.URL.String())
	})
	c, err := sprites.New(sprites.Config{Token: sprites.NewSecret(tok), BaseURL: newHTTPServer(t, mux)})
	if err != nil {
		t.Fatal(err)
	}
	_, err1 := c.Get(ctxFor(t), "x")
	_, err2 := c.Exec(ctxFor(t), "x", sprites.ExecOptions{Argv: []string{"echo", "argv-secret"}, Env: []string{"K=env-secret"}})
	// A refused connection: Go's *url.Error text quotes the whole URL.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dead, _ := sprites.New(sprites.Config{Token: sprites.NewSecret(tok), BaseURL: "http://" + addr})
	_, err3 := dead.Exec(ctxFor(t), "x", sprites.ExecOptions{Argv: []string{"echo", "argv-secret"}, Env: []string{"K=env-secret"}})
	_, err4 := dead.Get(ctxFor(t), "x")
	for i, e := range []error{err1, err2, err3, err4} {
		if e == nil {
			t.Fatalf("call %d succeeded; want an error", i+1)
		}
		s := fmt.Sprintf("%v %+v %#v", e, e, e)
		for _, secret := range []string{tok, "env-secret", "argv-secret"} {
			if strings.Contains(s, secret) {
				t.Errorf("error %d leaks %q: %s", i+1, secret, s)
			}
		}
	}
}
