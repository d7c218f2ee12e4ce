package sprites_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/adapter/internal/standin"
	"github.com/agentrunner/runner/adapter/sprites"
	"github.com/agentrunner/runner/adapter/sprites/spritestest"
)

type fixture struct {
	srv *spritestest.Server
	c   *sprites.Client
	rec *standin.Recorder
}

func newFixture(t *testing.T, opts spritestest.Options) fixture {
	t.Helper()
	srv := spritestest.New(t, opts)
	rec := standin.NewRecorder(t)
	c, err := sprites.New(sprites.Config{
		Token:      sprites.NewSecret(srv.Token),
		BaseURL:    srv.URL(),
		HTTPClient: &http.Client{Transport: rec},
	})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return fixture{srv: srv, c: c, rec: rec}
}

func ctxFor(t *testing.T) context.Context { return hostedtest.CtxWithin(t, 30*time.Second) }

var wantKind = hostedtest.WantKind

func mustCreate(t *testing.T, f fixture, name string) sprites.Sprite {
	t.Helper()
	s, err := f.c.Create(ctxFor(t), sprites.CreateRequest{Name: name})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return s
}

func TestSpriteLifecycle(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	ctx := ctxFor(t)

	created, err := f.c.Create(ctx, sprites.CreateRequest{Name: "alpha", URLSettings: &sprites.URLSettings{Auth: "public"}, Labels: []string{"ci"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if created.Name != "alpha" || created.ID == "" || created.Organization != f.srv.Org || created.URLSettings == nil || created.URLSettings.Auth != "public" {
		t.Errorf("create answered %+v", created)
	}
	got, err := f.c.Get(ctx, "alpha")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.ID != created.ID || got.CreatedAt.IsZero() || got.Status == "" {
		t.Errorf("get: got %+v, want id %s with status and created_at", got, created.ID)
	}
	if err := f.c.Delete(ctx, "alpha"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, ok := f.srv.Dir("alpha"); ok {
		t.Error("the sprite still exists after delete")
	}
	_, err = f.c.Get(ctx, "alpha")
	if !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("get after delete: got %v, want ErrNotFound", err)
	}
	var e *sprites.Error
	if !errors.As(err, &e) || e.Status != http.StatusNotFound || e.Code != "sprite not found" {
		t.Errorf("get after delete: detail %+v, want status 404 code %q", e, "sprite not found")
	}
	// Deleting an absent sprite is success: the API's own 404.
	if err := f.c.Delete(ctx, "alpha"); err != nil {
		t.Errorf("delete of an absent sprite: got %v, want nil", err)
	}
}

func TestCreateDuplicateIsConflictThenAdopt(t *testing.T) {
	for _, status := range []int{http.StatusConflict, http.StatusBadRequest} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			f := newFixture(t, spritestest.Options{DuplicateStatus: status})
			ctx := ctxFor(t)
			first := mustCreate(t, f, "dup")
			_, err := f.c.Create(ctx, sprites.CreateRequest{Name: "dup"})
			if !errors.Is(err, sprites.ErrCreateConflict) {
				t.Fatalf("second create: got %v, want ErrCreateConflict", err)
			}
			wantKind(t, "second create", err, adapter.KindInvalid)
			var e *sprites.Error
			if !errors.As(err, &e) || e.Status != status {
				t.Errorf("second create: detail %+v, want status %d", e, status)
			}
			// The caller's move: Get and adopt.
			adopted, err := f.c.Get(ctx, "dup")
			if err != nil || adopted.ID != first.ID {
				t.Errorf("adopt: got %+v, %v; want id %s", adopted, err, first.ID)
			}
		})
	}
}

func TestCreateInvalidName(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	_, err := f.c.Create(ctxFor(t), sprites.CreateRequest{Name: "Bad Name!"})
	wantKind(t, "create with a bad name", err, adapter.KindInvalid)
	// A 400 is also how the API may answer a duplicate: the sentinel tells
	// the caller to Get, and Get then says not found, so it was invalid.
	if !errors.Is(err, sprites.ErrCreateConflict) {
		t.Errorf("create with a bad name: got %v, want ErrCreateConflict (a 400 of create)", err)
	}
	_, err = f.c.Get(ctxFor(t), "Bad Name!")
	if !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("get of the refused name: got %v, want not_found", err)
	}
}

// TestErrorMapping is the error map, one row per provider answer.
func TestErrorMapping(t *testing.T) {
	type call struct {
		name string
		do   func(ctx context.Context, c *sprites.Client) error
	}
	get := call{"get", func(ctx context.Context, c *sprites.Client) error { _, err := c.Get(ctx, "present"); return err }}
	getAbsent := call{"get absent", func(ctx context.Context, c *sprites.Client) error { _, err := c.Get(ctx, "absent"); return err }}
	create := call{"create", func(ctx context.Context, c *sprites.Client) error {
		_, err := c.Create(ctx, sprites.CreateRequest{Name: "fresh"})
		return err
	}}
	list := call{"list", func(ctx context.Context, c *sprites.Client) error {
		_, err := c.List(ctx, sprites.ListOptions{})
		return err
	}}
	del := call{"delete", func(ctx context.Context, c *sprites.Client) error { return c.Delete(ctx, "present") }}
	write := call{"write file", func(ctx context.Context, c *sprites.Client) error {
		_, err := c.WriteFile(ctx, "present", "/x", []byte("x"), 0o644)
		return err
	}}
	exec := call{"exec", func(ctx context.Context, c *sprites.Client) error {
		s, err := c.Exec(ctx, "present", sprites.ExecOptions{Argv: []string{"true"}})
		if err == nil {
			s.Close()
		}
		return err
	}}
	all := []call{get, create, list, del, write, exec}

	tests := []struct {
		name  string
		fault func(s *spritestest.Server)
		calls []call
		want  adapter.Kind
		check func(t *testing.T, err error)
	}{
		{name: "the API's 404 on get is definitive", calls: []call{getAbsent}, want: adapter.KindNotFound},
		{name: "outage 503", fault: func(s *spritestest.Server) { s.SetOutage(true) }, calls: all, want: adapter.KindUnavailable},
		{name: "proxy 502", fault: func(s *spritestest.Server) { s.SetProxyError(true) }, calls: all, want: adapter.KindUnavailable},
		{name: "proxy drops the connection", fault: func(s *spritestest.Server) { s.SetDropConnections(true) }, calls: all, want: adapter.KindUnavailable},
		// A 404 without the API's body proves nothing, on get above all.
		{name: "bare 404 on get", fault: func(s *spritestest.Server) { s.SetProxyNotFound(true) }, calls: []call{get, getAbsent, del, list}, want: adapter.KindUnavailable},
		{name: "429 with Retry-After", fault: func(s *spritestest.Server) { s.RateLimit(100, 7*time.Second) }, calls: all, want: adapter.KindRateLimited,
			check: func(t *testing.T, err error) {
				var rl *adapter.RateLimitedError
				if !errors.As(err, &rl) || rl.RetryAfter != 7*time.Second {
					t.Errorf("got %v, want RetryAfter 7s", err)
				}
			}},
		{name: "list max_results out of range", calls: []call{{"list 501", func(ctx context.Context, c *sprites.Client) error {
			_, err := c.List(ctx, sprites.ListOptions{MaxResults: 501})
			return err
		}}}, want: adapter.KindInvalid},
		{name: "continuation token the API did not issue", calls: []call{{"list bad token", func(ctx context.Context, c *sprites.Client) error {
			_, err := c.List(ctx, sprites.ListOptions{ContinuationToken: "!!"})
			return err
		}}}, want: adapter.KindInvalid},
		{name: "exec without argv", calls: []call{{"exec empty", func(ctx context.Context, c *sprites.Client) error {
			_, err := c.Exec(ctx, "present", sprites.ExecOptions{})
			return err
		}}}, want: adapter.KindInvalid},
		{name: "exec in an absent sprite is not not_found", calls: []call{{"exec absent", func(ctx context.Context, c *sprites.Client) error {
			_, err := c.Exec(ctx, "absent", sprites.ExecOptions{Argv: []string{"true"}})
			return err
		}}}, want: adapter.KindProvider},
		{name: "write into an absent sprite is not not_found", calls: []call{{"write absent", func(ctx context.Context, c *sprites.Client) error {
			_, err := c.WriteFile(ctx, "absent", "/x", []byte("x"), 0o644)
			return err
		}}}, want: adapter.KindProvider},
		{name: "bad network policy", calls: []call{{"set policy", func(ctx context.Context, c *sprites.Client) error {
			return c.SetNetworkPolicy(ctx, "present", sprites.NetworkPolicy{Rules: []sprites.NetworkRule{{Domain: "x.com", Action: "maybe"}}})
		}}}, want: adapter.KindInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, spritestest.Options{})
			mustCreate(t, f, "present")
			if tt.fault != nil {
				tt.fault(f.srv)
			}
			for _, c := range tt.calls {
				err := c.do(ctxFor(t), f.c)
				wantKind(t, c.name, err, tt.want)
				if tt.check != nil {
					tt.check(t, err)
				}
			}
		})
	}

	t.Run("wrong token is denied", func(t *testing.T) {
		srv := spritestest.New(t, spritestest.Options{})
		c, err := sprites.New(sprites.Config{Token: sprites.NewSecret("wrong"), BaseURL: srv.URL()})
		if err != nil {
			t.Fatal(err)
		}
		for _, call := range all {
			wantKind(t, call.name, call.do(ctxFor(t), c), adapter.KindDenied)
		}
	})

	t.Run("the caller's context wins", func(t *testing.T) {
		f := newFixture(t, spritestest.Options{})
		f.srv.SetDropConnections(true)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := f.c.Get(ctx, "x")
		if !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	})

	t.Run("no redirect is followed", func(t *testing.T) {
		target := spritestest.New(t, spritestest.Options{})
		redir := http.NewServeMux()
		redir.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL()+r.URL.RequestURI(), http.StatusTemporaryRedirect)
		})
		rs := newHTTPServer(t, redir)
		c, err := sprites.New(sprites.Config{Token: sprites.NewSecret("tok-redirect"), BaseURL: rs})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Get(ctxFor(t), "x")
		wantKind(t, "get through a redirect", err, adapter.KindProvider)
		if n := target.Requests("GET /v1/sprites/x"); n != 0 {
			t.Errorf("the redirect was followed: the target saw %d requests", n)
		}
	})
}

func TestNew(t *testing.T) {
	if _, err := sprites.New(sprites.Config{}); adapter.KindOf(err) != adapter.KindInvalid {
		t.Errorf("no token: got %v, want invalid", err)
	}
	if _, err := sprites.New(sprites.Config{Token: sprites.NewSecret("t"), BaseURL: "ftp://x"}); adapter.KindOf(err) != adapter.KindInvalid {
		t.Errorf("bad URL: got %v, want invalid", err)
	}
}

func TestListPaging(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	ctx := ctxFor(t)
	var want []string
	for i := range 7 {
		n := fmt.Sprintf("run-%02d", i)
		mustCreate(t, f, n)
		want = append(want, n)
	}
	mustCreate(t, f, "other")

	var got []string
	opts := sprites.ListOptions{Prefix: "run-", MaxResults: 3}
	pages := 0
	for {
		p, err := f.c.List(ctx, opts)
		if err != nil {
			t.Fatalf("list page %d: %v", pages, err)
		}
		pages++
		if len(p.Sprites) > 3 {
			t.Errorf("page %d has %d entries, want at most 3", pages, len(p.Sprites))
		}
		for _, s := range p.Sprites {
			got = append(got, s.Name)
			if s.OrgSlug != f.srv.Org {
				t.Errorf("entry %s: org_slug %q, want %q", s.Name, s.OrgSlug, f.srv.Org)
			}
		}
		if p.NextToken == "" {
			break
		}
		opts.ContinuationToken = p.NextToken
	}
	if pages != 3 || !slices.Equal(got, want) {
		t.Errorf("got %v in %d pages, want %v in 3", got, pages, want)
	}
	all, err := f.c.ListAll(ctx, sprites.ListOptions{MaxResults: 2})
	if err != nil || len(all) != 8 {
		t.Errorf("list all: got %d entries, %v; want 8", len(all), err)
	}
}

func TestListInterrupted(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	ctx := ctxFor(t)
	for i := range 5 {
		mustCreate(t, f, fmt.Sprintf("s%d", i))
	}
	f.srv.InterruptList(1)
	_, err := f.c.List(ctx, sprites.ListOptions{})
	wantKind(t, "cut list", err, adapter.KindUnavailable)

	// The second page is cut: the whole listing fails, never a partial set.
	f.srv.InterruptList(0)
	p, err := f.c.List(ctx, sprites.ListOptions{MaxResults: 2})
	if err != nil || p.NextToken == "" {
		t.Fatalf("first page: %+v, %v", p, err)
	}
	f.srv.InterruptList(1)
	all, err := f.c.ListAll(ctx, sprites.ListOptions{MaxResults: 2, ContinuationToken: p.NextToken})
	wantKind(t, "list all with a cut page", err, adapter.KindUnavailable)
	if all != nil {
		t.Errorf("list all returned %d entries with an error, want none", len(all))
	}
}

// TestListDishonestAnswers feeds List answers the stand-in never gives: a
// has_more with no token, a body missing its required fields.
func TestListDishonestAnswers(t *testing.T) {
	tests := []struct{ name, body string }{
		{"has_more without a token", `{"sprites":[{"name":"a","org_slug":"o"}],"has_more":true}`},
		{"no has_more", `{"sprites":[]}`},
		{"no sprites", `{"has_more":false}`},
		{"not JSON", `<html>`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.HandleFunc("GET /v1/sprites", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(tt.body))
			})
			c, err := sprites.New(sprites.Config{Token: sprites.NewSecret("t"), BaseURL: newHTTPServer(t, mux)})
			if err != nil {
				t.Fatal(err)
			}
			p, err := c.List(ctxFor(t), sprites.ListOptions{})
			wantKind(t, "list", err, adapter.KindUnavailable)
			if len(p.Sprites) != 0 {
				t.Errorf("got a page of %d with the error", len(p.Sprites))
			}
		})
	}
	t.Run("has_more false ends the listing even with a token", func(t *testing.T) {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/sprites", func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"sprites":[{"name":"a","org_slug":"o"}],"has_more":false,"next_continuation_token":"t"}`))
		})
		c, _ := sprites.New(sprites.Config{Token: sprites.NewSecret("t"), BaseURL: newHTTPServer(t, mux)})
		p, err := c.List(ctxFor(t), sprites.ListOptions{})
		if err != nil || p.NextToken != "" || len(p.Sprites) != 1 {
			t.Errorf("got %+v, %v; want one entry and no next token", p, err)
		}
	})
}

func TestFiles(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	ctx := ctxFor(t)
	mustCreate(t, f, "fs")
	data := make([]byte, 300<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	fi, err := f.c.WriteFile(ctx, "fs", "/home/sprite/bin/runner-shim", data, 0o755)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if fi.Size != int64(len(data)) || fi.Mode != "0755" {
		t.Errorf("write answered %+v, want size %d mode 0755", fi, len(data))
	}
	dir, _ := f.srv.Dir("fs")
	st, err := os.Stat(filepath.Join(dir, "home/sprite/bin/runner-shim"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("stored file: %v, %v; want mode 0755", st, err)
	}
	back, err := f.c.ReadFile(ctx, "fs", "/home/sprite/bin/runner-shim")
	if err != nil || string(back) != string(data) {
		t.Errorf("read back: %d bytes, %v; want the %d written", len(back), err, len(data))
	}
	// The uploaded binary runs (the shim install path).
	if _, err := f.c.WriteFile(ctx, "fs", "/tmp/hello", []byte("#!/bin/sh\necho hi \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := f.c.Run(ctx, "fs", sprites.ExecOptions{Argv: []string{"/tmp/hello", "there"}}, nil)
	if err != nil || string(r.Stdout) != "hi there\n" || r.ExitCode != 0 {
		t.Errorf("run the uploaded file: %q exit %d, %v", r.Stdout, r.ExitCode, err)
	}
	_, err = f.c.ReadFile(ctx, "fs", "/missing")
	if !errors.Is(err, sprites.ErrNoFile) {
		t.Errorf("read of a missing file: got %v, want ErrNoFile", err)
	}
	wantKind(t, "read of a missing file", err, adapter.KindProvider)
	// ".." cannot leave the sprite.
	if _, err := f.c.WriteFile(ctx, "fs", "/../../tmp/escape", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "tmp", "escape")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a write escaped the sprite's directory: %v", err)
	}
}

func TestNetworkPolicy(t *testing.T) {
	f := newFixture(t, spritestest.Options{})
	ctx := ctxFor(t)
	mustCreate(t, f, "net")
	p, err := f.c.NetworkPolicy(ctx, "net")
	if err != nil || len(p.Rules) != 0 {
		t.Fatalf("initial policy: %+v, %v; want no rules", p, err)
	}
	want := sprites.NetworkPolicy{Rules: []sprites.NetworkRule{
		{Domain: "api.github.com", Action: "allow"}, {Domain: "*", Action: "deny"}, {Include: "defaults"},
	}}
	if err := f.c.SetNetworkPolicy(ctx, "net", want); err != nil {
		t.Fatalf("set: %v", err)
	}
	got, err := f.c.NetworkPolicy(ctx, "net")
	if err != nil || !slices.Equal(got.Rules, want.Rules) {
		t.Errorf("policy: got %+v, %v; want %+v", got, err, want)
	}
}

func newHTTPServer(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}
