package e2b_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
	"github.com/agentrunner/runner/adapter/internal/standin"
)

type fixture struct {
	srv *e2btest.Server
	c   *e2b.Client
	rec *standin.Recorder
}

func newFixture(t *testing.T, opts e2btest.Options) fixture {
	t.Helper()
	srv := e2btest.New(t, opts)
	rec := standin.NewRecorder(t)
	c, err := e2b.New(e2b.Config{
		APIKey:     e2b.NewSecret(srv.APIKey),
		APIURL:     srv.URL(),
		SandboxURL: srv.SandboxURL(),
		HTTPClient: &http.Client{Transport: rec},
	})
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return fixture{srv: srv, c: c, rec: rec}
}

func ctxFor(t *testing.T) context.Context { return hostedtest.CtxWithin(t, 20*time.Second) }

var wantKind = hostedtest.WantKind

func TestSandboxLifecycle(t *testing.T) {
	f := newFixture(t, e2btest.Options{})
	ctx := ctxFor(t)

	sb, err := f.c.Create(ctx, e2b.NewSandbox{TemplateID: "runner", Timeout: 600, AutoPause: true, Secure: true, Metadata: map[string]string{"runner-name": "alpha"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.SandboxID == "" || sb.EnvdAccessToken.IsZero() || sb.EnvdVersion != e2btest.EnvdVersion || sb.TemplateID != "runner" {
		t.Fatalf("create answered %+v, want an id, a token, envd %s, template runner", sb, e2btest.EnvdVersion)
	}
	got, err := f.c.Get(ctx, sb.SandboxID)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.SandboxID != sb.SandboxID || got.State != e2b.StateRunning || got.Metadata["runner-name"] != "alpha" ||
		got.EnvdAccessToken.Reveal() != sb.EnvdAccessToken.Reveal() || got.StartedAt.IsZero() {
		t.Errorf("get answered %+v, want the created sandbox, running, with its metadata and token", got)
	}

	if ttl, _ := f.srv.Timeout(sb.SandboxID); ttl != 600 {
		t.Errorf("time to live after create: %d, want the 600 asked for", ttl)
	}
	if err := f.c.SetTimeout(ctx, sb.SandboxID, 3600); err != nil {
		t.Fatalf("set timeout: %v", err)
	}
	if ttl, _ := f.srv.Timeout(sb.SandboxID); ttl != 3600 {
		t.Errorf("time to live after SetTimeout: %d, want 3600", ttl)
	}
	wantKind(t, "set timeout of an unknown sandbox", f.c.SetTimeout(ctx, "nope", 60), adapter.KindProvider)

	if err := f.c.Pause(ctx, sb.SandboxID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if got, err := f.c.Get(ctx, sb.SandboxID); err != nil || got.State != e2b.StatePaused {
		t.Errorf("get after pause: got state %q, %v; want paused", got.State, err)
	}
	wantKind(t, "pause of a paused sandbox (409)", f.c.Pause(ctx, sb.SandboxID), adapter.KindInvalid)
	_, err = f.c.Envd(sb).List(ctx)
	wantKind(t, "envd of a paused sandbox (proxy 502)", err, adapter.KindUnavailable)

	if _, err := f.c.Resume(ctx, sb.SandboxID, 60); err != nil {
		t.Fatalf("resume: %v", err)
	}
	_, err = f.c.Resume(ctx, sb.SandboxID, 60)
	wantKind(t, "resume of a running sandbox (409)", err, adapter.KindInvalid)
	if _, resumed, err := f.c.Connect(ctx, sb.SandboxID, 60); err != nil || resumed {
		t.Errorf("connect to a running sandbox: resumed=%v, %v; want false, nil", resumed, err)
	}
	if err := f.c.Pause(ctx, sb.SandboxID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if got, resumed, err := f.c.Connect(ctx, sb.SandboxID, 60); err != nil || !resumed || got.EnvdAccessToken.IsZero() {
		t.Errorf("connect to a paused sandbox: resumed=%v, token set=%v, %v; want true, true, nil", resumed, !got.EnvdAccessToken.IsZero(), err)
	}

	if err := f.c.Delete(ctx, sb.SandboxID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, ok := f.srv.Dir(sb.SandboxID); ok {
		t.Errorf("the stand-in still has the deleted sandbox")
	}
	_, err = f.c.Get(ctx, sb.SandboxID)
	if !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("get after delete: got %v, want adapter.ErrNotFound", err)
	}
	// Only GET's 404 is definitive; a second delete's 404 is reported with
	// its status, for the layer above to confirm with Get.
	err = f.c.Delete(ctx, sb.SandboxID)
	wantKind(t, "second delete", err, adapter.KindProvider)
	var e *e2b.Error
	if !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Errorf("second delete: got %#v, want an *e2b.Error with Status 404", err)
	}
	wantKind(t, "pause of a deleted sandbox", f.c.Pause(ctx, sb.SandboxID), adapter.KindProvider)
}

func TestCreateRefusesMissingTemplate(t *testing.T) {
	f := newFixture(t, e2btest.Options{})
	_, err := f.c.Create(ctxFor(t), e2b.NewSandbox{})
	wantKind(t, "create without a template (400)", err, adapter.KindInvalid)
}

func TestListPaging(t *testing.T) {
	f := newFixture(t, e2btest.Options{})
	ctx := ctxFor(t)
	var ids []string
	for i := range 7 {
		sb, err := f.c.Create(ctx, e2b.NewSandbox{TemplateID: "runner", Metadata: map[string]string{"runner-name": fmt.Sprint("n", i), "owner": "me"}})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		ids = append(ids, sb.SandboxID)
	}
	other, err := f.c.Create(ctx, e2b.NewSandbox{TemplateID: "runner", Metadata: map[string]string{"owner": "someone else"}})
	if err != nil {
		t.Fatal(err)
	}

	opts := e2b.ListOptions{Metadata: map[string]string{"owner": "me"}, Limit: 3}
	var sizes []int
	var seen []string
	for {
		p, err := f.c.List(ctx, opts)
		if err != nil {
			t.Fatalf("list page %d: %v", len(sizes), err)
		}
		sizes = append(sizes, len(p.Sandboxes))
		for _, sb := range p.Sandboxes {
			seen = append(seen, sb.SandboxID)
		}
		if p.NextToken == "" {
			break
		}
		opts.NextToken = p.NextToken
	}
	// The API lists newest first.
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	if !slices.Equal(sizes, []int{3, 3, 1}) || !slices.Equal(seen, newest) {
		t.Errorf("pages of %v holding %v; want pages of [3 3 1] holding %v", sizes, seen, newest)
	}

	all, err := f.c.ListAll(ctx, e2b.ListOptions{Limit: 2})
	if err != nil {
		t.Fatalf("list all: %v", err)
	}
	if len(all) != 8 || all[0].SandboxID != other.SandboxID {
		t.Errorf("list all: got %d sandboxes, want 8 starting with the newest, %s", len(all), other.SandboxID)
	}

	if err := f.c.Pause(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	paused, err := f.c.ListAll(ctx, e2b.ListOptions{States: []string{e2b.StatePaused}})
	if err != nil || len(paused) != 1 || paused[0].SandboxID != ids[2] || paused[0].State != e2b.StatePaused {
		t.Errorf("list of paused: got %+v, %v; want only %s", paused, err, ids[2])
	}

	// A body cut mid-page is an error, never a short page.
	f.srv.InterruptList(1)
	p, err := f.c.List(ctx, e2b.ListOptions{})
	wantKind(t, "list with its body cut", err, adapter.KindUnavailable)
	if len(p.Sandboxes) != 0 {
		t.Errorf("list with its body cut returned %d sandboxes, want none", len(p.Sandboxes))
	}
	f.srv.InterruptList(1)
	all, err = f.c.ListAll(ctx, e2b.ListOptions{Limit: 2})
	wantKind(t, "list all with one page cut", err, adapter.KindUnavailable)
	if all != nil {
		t.Errorf("list all with one page cut returned %d sandboxes, want nil", len(all))
	}
}

func TestFaults(t *testing.T) {
	f := newFixture(t, e2btest.Options{})
	ctx := ctxFor(t)
	sb, err := f.c.Create(ctx, e2b.NewSandbox{TemplateID: "runner", Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	envd := f.c.Envd(sb)

	f.srv.SetOutage(true)
	_, err = f.c.Get(ctx, sb.SandboxID)
	wantKind(t, "get during an outage", err, adapter.KindUnavailable)
	_, err = f.c.Create(ctx, e2b.NewSandbox{TemplateID: "runner"})
	wantKind(t, "create during an outage", err, adapter.KindUnavailable)
	_, err = envd.Start(ctx, e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: "true"}})
	wantKind(t, "start during an outage", err, adapter.KindUnavailable)
	f.srv.SetOutage(false)

	f.srv.SetDropConnections(true)
	_, err = f.c.Get(ctx, sb.SandboxID)
	wantKind(t, "get through a proxy that drops connections", err, adapter.KindUnavailable)
	_, err = f.c.List(ctx, e2b.ListOptions{})
	wantKind(t, "list through a proxy that drops connections", err, adapter.KindUnavailable)
	err = envd.SendSignal(ctx, e2b.Selector{PID: 1}, e2b.SIGKILL)
	wantKind(t, "signal through a proxy that drops connections", err, adapter.KindUnavailable)
	f.srv.SetDropConnections(false)

	f.srv.RateLimit(1, 3*time.Second)
	_, err = f.c.Get(ctx, sb.SandboxID)
	var rl *adapter.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 3*time.Second {
		t.Errorf("get while throttled: got %v, want *adapter.RateLimitedError with RetryAfter 3s", err)
	}
	if _, err := f.c.Get(ctx, sb.SandboxID); err != nil {
		t.Errorf("get after the throttle: %v", err)
	}

	bad, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret("e2b_wrong"), APIURL: f.srv.URL(), SandboxURL: f.srv.SandboxURL()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Get(ctx, sb.SandboxID)
	wantKind(t, "get with a wrong key", err, adapter.KindDenied)

	forged := sb
	forged.EnvdAccessToken = e2b.NewSecret("forged")
	_, err = f.c.Envd(forged).List(ctx)
	wantKind(t, "envd with a wrong access token", err, adapter.KindDenied)
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  e2b.Config
	}{
		{"no key", e2b.Config{APIURL: "http://127.0.0.1:1"}},
		{"bad api url", e2b.Config{APIKey: e2b.NewSecret("k"), APIURL: "ftp://x"}},
		{"bad sandbox url", e2b.Config{APIKey: e2b.NewSecret("k"), SandboxURL: "no-scheme"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e2b.New(tc.cfg)
			wantKind(t, "new", err, adapter.KindInvalid)
		})
	}
}
