package daytona_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona"
	"github.com/agentrunner/runner/adapter/daytona/daytonatest"
)

func newClient(t *testing.T, srv *daytonatest.Server) *daytona.Client {
	t.Helper()
	c, err := daytona.New(daytona.Config{APIKey: daytona.NewSecret(srv.APIKey), APIURL: srv.URL(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// started creates a sandbox and waits until it runs.
func started(t *testing.T, c *daytona.Client, name string) daytona.Sandbox {
	t.Helper()
	ctx := testCtx(t)
	sb, err := c.Create(ctx, daytona.CreateSandbox{Name: name, Labels: map[string]string{"app": "runner"}})
	if err != nil {
		t.Fatalf("Create %s: %v", name, err)
	}
	sb, err = c.WaitState(ctx, sb.ID, daytona.StateStarted)
	if err != nil {
		t.Fatalf("WaitState %s: %v", name, err)
	}
	return sb
}

func wantKind(t *testing.T, err error, want adapter.Kind) {
	t.Helper()
	if got := adapter.KindOf(err); got != want {
		t.Fatalf("kind of %v: got %s, want %s", err, got, want)
	}
}

func TestCreateWaitGet(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{StartDelay: 50 * time.Millisecond})
	c := newClient(t, srv)
	ctx := testCtx(t)
	sb, err := c.Create(ctx, daytona.CreateSandbox{
		Name: "fountain-a-01", Snapshot: "runner:1", Env: map[string]string{"K": "v"},
		Labels: map[string]string{"app": "runner"}, NetworkBlockAll: true, NetworkAllowList: "10.0.0.0/8",
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if sb.State != daytona.StateCreating || sb.Name != "fountain-a-01" || sb.ID == "" {
		t.Fatalf("Create answered %+v, want state creating with the name", sb)
	}
	sb, err = c.WaitState(ctx, "fountain-a-01", daytona.StateStarted)
	if err != nil {
		t.Fatalf("WaitState: %v", err)
	}
	byID, err := c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatalf("Get by id: %v", err)
	}
	if byID.ID != sb.ID || byID.Name != "fountain-a-01" || byID.Snapshot != "runner:1" || byID.Env["K"] != "v" ||
		byID.Labels["app"] != "runner" || !byID.NetworkBlockAll || byID.NetworkAllowList != "10.0.0.0/8" ||
		byID.ToolboxProxyURL != srv.ToolboxProxyURL() || byID.State != daytona.StateStarted {
		t.Fatalf("Get: got %+v", byID)
	}
}

func TestCreateNameTakenAdopts(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	ctx := testCtx(t)
	first := started(t, c, "fountain-b-01")
	_, err := c.Create(ctx, daytona.CreateSandbox{Name: "fountain-b-01"})
	if !errors.Is(err, daytona.ErrNameTaken) {
		t.Fatalf("second Create: got %v, want ErrNameTaken", err)
	}
	wantKind(t, err, adapter.KindInvalid)
	var de *daytona.Error
	if !errors.As(err, &de) || de.Status != http.StatusConflict || !de.OwnBody {
		t.Fatalf("second Create: got %#v, want a 409 from the API", de)
	}
	adopted, err := c.Get(ctx, "fountain-b-01")
	if err != nil || adopted.ID != first.ID {
		t.Fatalf("Get by name: got %+v, %v; want id %s", adopted, err, first.ID)
	}
}

func TestGetNotFoundIsDefinitive(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	_, err := c.Get(testCtx(t), "nope")
	if !errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Get absent: got %v, want ErrNotFound", err)
	}
}

func TestDeleteIsAsyncAndFreesTheName(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{DeleteDelay: 300 * time.Millisecond})
	c := newClient(t, srv)
	ctx := testCtx(t)
	old := started(t, c, "fountain-c-01")
	if err := c.Delete(ctx, "fountain-c-01"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	got, err := c.Get(ctx, old.ID)
	if err != nil || got.State != daytona.StateDestroying {
		t.Fatalf("Get right after delete: got %q, %v; want destroying", got.State, err)
	}
	// The name is free at once.
	fresh, err := c.Create(ctx, daytona.CreateSandbox{Name: "fountain-c-01"})
	if err != nil {
		t.Fatalf("Create with the freed name: %v", err)
	}
	if fresh.ID == old.ID {
		t.Fatalf("Create with the freed name returned the old id")
	}
	byName, err := c.Get(ctx, "fountain-c-01")
	if err != nil || byName.ID != fresh.ID {
		t.Fatalf("Get by name: got %s, %v; want %s", byName.ID, err, fresh.ID)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = c.Get(ctx, old.ID)
		if errors.Is(err, adapter.ErrNotFound) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("Get of the deleted id: got %v, want ErrNotFound in time", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Deleting what is gone: the API's 404, but only GET may say not_found.
	err = c.Delete(ctx, old.ID)
	var de *daytona.Error
	if !errors.As(err, &de) || de.Status != http.StatusNotFound || errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Delete of a gone sandbox: got %v, want a 404 that is not ErrNotFound", err)
	}
	wantKind(t, err, adapter.KindProvider)
}

func TestStopStartKeepsDisk(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	ctx := testCtx(t)
	sb := started(t, c, "fountain-d-01")
	tb, err := c.Toolbox(ctx, sb)
	if err != nil {
		t.Fatalf("Toolbox: %v", err)
	}
	if err := tb.Upload(ctx, "keep/me.txt", []byte("disk\x00bytes")); err != nil {
		t.Fatalf("Upload: %v", err)
	}
	if err := c.Stop(ctx, sb.ID); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := c.WaitState(ctx, sb.ID, daytona.StateStopped); err != nil {
		t.Fatalf("WaitState stopped: %v", err)
	}
	// The proxy cannot reach a stopped sandbox: 502, unavailable.
	_, err = tb.Download(ctx, "keep/me.txt")
	wantKind(t, err, adapter.KindUnavailable)
	if err := c.Stop(ctx, sb.ID); !errors.Is(err, adapter.ErrInvalid) {
		t.Fatalf("Stop of a stopped sandbox: got %v, want invalid", err)
	}
	if err := c.Start(ctx, sb.ID); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if _, err := c.WaitState(ctx, sb.ID, daytona.StateStarted); err != nil {
		t.Fatalf("WaitState started: %v", err)
	}
	b, err := tb.Download(ctx, "keep/me.txt")
	if err != nil || string(b) != "disk\x00bytes" {
		t.Fatalf("Download after restart: got %q, %v", b, err)
	}
}

func TestListPaging(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	ctx := testCtx(t)
	var want []string
	for i := range 5 {
		sb, err := c.Create(ctx, daytona.CreateSandbox{Name: fmt.Sprintf("fountain-e-%02d", i), Labels: map[string]string{"app": "runner"}})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		want = append(want, sb.ID)
	}
	if _, err := c.Create(ctx, daytona.CreateSandbox{Name: "other", Labels: map[string]string{"app": "else"}}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	p, err := c.List(ctx, daytona.ListOptions{Limit: 2, Labels: map[string]string{"app": "runner"}})
	if err != nil || len(p.Items) != 2 || p.NextCursor == "" {
		t.Fatalf("first page: got %d items, cursor %q, %v", len(p.Items), p.NextCursor, err)
	}
	all, err := c.ListAll(ctx, daytona.ListOptions{Limit: 2, Labels: map[string]string{"app": "runner"}})
	if err != nil {
		t.Fatalf("ListAll: %v", err)
	}
	var got []string
	for _, sb := range all {
		got = append(got, sb.ID)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("ListAll: got %v, want %v", got, want)
	}
	byName, err := c.ListAll(ctx, daytona.ListOptions{Name: "fountain-e-03"})
	if err != nil || len(byName) != 1 || byName[0].ID != want[3] {
		t.Fatalf("List by name: got %+v, %v", byName, err)
	}
	// Every sandbox is still creating (30 ms), or started: filter on the
	// state the first one has now.
	none, err := c.ListAll(ctx, daytona.ListOptions{States: []string{daytona.StateArchived}})
	if err != nil || len(none) != 0 {
		t.Fatalf("List archived: got %d, %v; want none", len(none), err)
	}
	before := srv.Requests("GET /sandbox")
	_, err = c.List(ctx, daytona.ListOptions{Limit: daytona.MaxListLimit + 1})
	wantKind(t, err, adapter.KindInvalid)
	if srv.Requests("GET /sandbox") != before {
		t.Fatalf("an out-of-range limit was sent")
	}
}

func TestListInterruptedIsAnError(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	ctx := testCtx(t)
	for i := range 3 {
		if _, err := c.Create(ctx, daytona.CreateSandbox{Name: fmt.Sprintf("fountain-f-%d", i)}); err != nil {
			t.Fatalf("Create: %v", err)
		}
	}
	// The second page is cut mid-body: the listing fails whole.
	srv.InterruptList(1)
	if _, err := c.List(ctx, daytona.ListOptions{Limit: 1}); err == nil {
		t.Fatalf("cut first page: got no error")
	} else {
		wantKind(t, err, adapter.KindUnavailable)
	}
	p, err := c.List(ctx, daytona.ListOptions{Limit: 1})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	srv.InterruptList(1)
	all, err := c.ListAll(ctx, daytona.ListOptions{Limit: 1, Cursor: p.NextCursor})
	if err == nil || all != nil {
		t.Fatalf("ListAll over a cut page: got %d items, %v; want nothing and an error", len(all), err)
	}
	wantKind(t, err, adapter.KindUnavailable)
	all, err = c.ListAll(ctx, daytona.ListOptions{Limit: 1})
	if err != nil || len(all) != 3 {
		t.Fatalf("ListAll after the fault: got %d, %v", len(all), err)
	}
}

// TestListMalformedPages serves pages a proxy could have mangled: each is
// an error, never a short or empty listing.
func TestListMalformedPages(t *testing.T) {
	cases := []struct{ name, body string }{
		{"no items", `{"nextCursor":null}`},
		{"items null", `{"items":null}`},
		{"truncated", `{"items":[{"id":"a","name":"a","state":"started"}`},
		{"not json", `<html>ok</html>`},
		{"items not a list", `{"items":{"id":"a"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprint(w, tc.body)
			}))
			defer hs.Close()
			c, err := daytona.New(daytona.Config{APIKey: daytona.NewSecret("k"), APIURL: hs.URL})
			if err != nil {
				t.Fatal(err)
			}
			all, err := c.ListAll(testCtx(t), daytona.ListOptions{})
			if err == nil || all != nil {
				t.Fatalf("got %v, %v; want an error and no items", all, err)
			}
			wantKind(t, err, adapter.KindUnavailable)
		})
	}
	// A cursor that repeats would page forever.
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"items":[],"nextCursor":"same"}`)
	}))
	defer hs.Close()
	c, _ := daytona.New(daytona.Config{APIKey: daytona.NewSecret("k"), APIURL: hs.URL})
	_, err := c.ListAll(testCtx(t), daytona.ListOptions{})
	wantKind(t, err, adapter.KindUnavailable)
}

func TestFaultsThroughTheStandIn(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	ctx := testCtx(t)
	sb := started(t, c, "fountain-g-01")
	tb, err := c.Toolbox(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}

	srv.SetOutage(true)
	_, err = c.Get(ctx, sb.ID)
	wantKind(t, err, adapter.KindUnavailable)
	_, err = c.Get(ctx, "absent")
	wantKind(t, err, adapter.KindUnavailable) // an outage proves no absence
	_, err = tb.Execute(ctx, daytona.ExecuteRequest{Command: "true"})
	wantKind(t, err, adapter.KindUnavailable)
	srv.SetOutage(false)

	srv.SetDropConnections(true)
	_, err = c.Get(ctx, "absent")
	wantKind(t, err, adapter.KindUnavailable)
	_, err = tb.Execute(ctx, daytona.ExecuteRequest{Command: "true"})
	wantKind(t, err, adapter.KindUnavailable)
	srv.SetDropConnections(false)

	srv.RateLimit(1, 3*time.Second)
	_, err = c.Get(ctx, sb.ID)
	var rl *adapter.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 3*time.Second {
		t.Fatalf("rate limited Get: got %v, want RetryAfter 3s", err)
	}
	if _, err := c.Get(ctx, sb.ID); err != nil {
		t.Fatalf("Get after the throttle: %v", err)
	}
}

func TestCallerContextWins(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Get(ctx, "x")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	wantKind(t, err, adapter.KindContext)
	// WaitState for a state that never comes ends with the context.
	sb := started(t, c, "fountain-h-01")
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	_, err = c.WaitState(ctx2, sb.ID, daytona.StateStopped)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitState: got %v, want DeadlineExceeded", err)
	}
}

func TestToolboxProxyURLFromAPI(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{})
	c := newClient(t, srv)
	ctx := testCtx(t)
	sb := started(t, c, "fountain-i-01")
	// An API that leaves toolboxProxyUrl out of the Sandbox: ask for it.
	tb, err := c.Toolbox(ctx, daytona.Sandbox{ID: sb.ID})
	if err != nil {
		t.Fatalf("Toolbox: %v", err)
	}
	if srv.Requests("GET /sandbox/"+sb.ID+"/toolbox-proxy-url") != 1 {
		t.Fatalf("the proxy URL was not asked for")
	}
	r, err := tb.Execute(ctx, daytona.ExecuteRequest{Command: "echo ok"})
	if err != nil || r.Result != "ok\n" || r.ExitCode != 0 {
		t.Fatalf("Execute: got %+v, %v", r, err)
	}
}

func TestWaitStateEndsOnError(t *testing.T) {
	srv := daytonatest.New(t, daytonatest.Options{FailSnapshot: "broken:1"})
	c := newClient(t, srv)
	ctx := testCtx(t)
	sb, err := c.Create(ctx, daytona.CreateSandbox{Name: "fountain-j-01", Snapshot: "broken:1"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.WaitState(ctx, sb.ID, daytona.StateStarted)
	wantKind(t, err, adapter.KindProvider)
	if got.State != daytona.StateError || !strings.Contains(err.Error(), "snapshot broken:1 failed to start") {
		t.Fatalf("WaitState: got state %q, %v", got.State, err)
	}
}
