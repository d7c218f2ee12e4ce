package daemon_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentrunner/runner/wire"
)

func TestAuthAndRoutes(t *testing.T) {
	a := startDaemon(t)
	anon := *a
	anon.token = ""
	wrong := *a
	wrong.token = "nope"

	tests := []struct {
		name   string
		api    *api
		method string
		path   string
		status int
		code   wire.Code
		detail string
	}{
		{"no token", &anon, "GET", "/v1/sandboxes", 401, wire.CodeDenied, ""},
		{"wrong token", &wrong, "GET", "/v1/sandboxes/x", 401, wire.CodeDenied, ""},
		{"metrics need a token", &anon, "GET", "/metrics", 401, wire.CodeDenied, ""},
		{"unknown route", a, "GET", "/v1/nothing", 404, wire.CodeInvalid, wire.DetailNoRoute},
		{"unknown deep route", a, "GET", "/v1/sandboxes/x/y/z", 404, wire.CodeInvalid, wire.DetailNoRoute},
		{"wrong method", a, "PATCH", "/v1/sandboxes/x", 405, wire.CodeInvalid, ""},
		{"absent sandbox", a, "GET", "/v1/sandboxes/absent", 404, wire.CodeNotFound, ""},
		{"absent sandbox's sessions", a, "GET", "/v1/sandboxes/absent/sessions", 404, wire.CodeNotFound, ""},
		{"bad name", a, "GET", "/v1/sandboxes/Bad_Name", 400, wire.CodeInvalid, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.api.t = t
			r := tt.api.do(tt.method, tt.path, nil)
			tt.api.wantError(r, tt.status, tt.code)
			if tt.detail != "" && r.errBody(t).Detail != tt.detail {
				t.Errorf("detail %q, want %q", r.errBody(t).Detail, tt.detail)
			}
			if wire.IsDefinitiveAbsence(r.status, r.header.Get(wire.HeaderError)) != (tt.code == wire.CodeNotFound) {
				t.Errorf("IsDefinitiveAbsence wrong for %d %s", r.status, tt.code)
			}
		})
	}
	a.t = t
	r := anon.do("GET", "/healthz", nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"ok"`) {
		t.Errorf("healthz: got %d %s", r.status, r.body)
	}
	var caps wire.Capabilities
	a.must("GET", "/v1/capabilities", nil, 200, &caps)
	want := []string{"attach", "suspend", "terminate_session", "tty"}
	if hostHasLimits() { // cgroups are on by default (resource_limits_test.go)
		want = []string{"attach", "resource_limits", "suspend", "terminate_session", "tty"}
		if _, err := os.Stat("/sys/fs/cgroup/freezer"); err == nil { // and with the freezer, checkpoints
			want = []string{"attach", "checkpoint", "fork", "resource_limits", "suspend", "terminate_session", "tty"}
		}
	}
	if !slices.Equal(caps.Capabilities, want) {
		t.Errorf("capabilities %v, want %v", caps.Capabilities, want)
	}
}

func TestTokenGeneratedOnFirstStart(t *testing.T) {
	state := t.TempDir()
	a := startDaemonIn(t, state, "")
	fi, err := os.Stat(filepath.Join(state, "token"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token mode %v, want 0600", fi.Mode().Perm())
	}
	if len(a.token) != 64 {
		t.Errorf("token length %d, want 64", len(a.token))
	}
	a.must("GET", "/v1/sandboxes", nil, 200, nil)
}

func TestCreateIdempotentUnderConcurrency(t *testing.T) {
	a := startDaemon(t)
	const n = 16
	got := make([]wire.Sandbox, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := *a
			b.t = t
			var sb wire.Sandbox
			r := b.do("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "same"})
			if r.status != 200 {
				t.Errorf("create: %d %s", r.status, r.body)
				return
			}
			if err := jsonUnmarshal(r.body, &sb); err != nil {
				t.Error(err)
			}
			got[i] = sb
		}()
	}
	wg.Wait()
	for i := range got {
		if got[i] != got[0] && !sandboxEqual(got[i], got[0]) {
			t.Fatalf("create %d: got %+v, want %+v", i, got[i], got[0])
		}
	}
	sb := got[0]
	if sb.Name != "same" || sb.State != "running" || sb.Incarnation == "" || sb.Workspace == "" {
		t.Fatalf("sandbox %+v", sb)
	}
	if fi, err := os.Stat(sb.WorkspaceOnHost()); err != nil || !fi.IsDir() {
		t.Fatalf("workspace %s: %v", sb.WorkspaceOnHost(), err)
	}
	var again wire.Sandbox
	a.must("GET", "/v1/sandboxes/same", nil, 200, &again)
	if !sandboxEqual(again, sb) {
		t.Errorf("get: %+v, want %+v", again, sb)
	}
	a.must("DELETE", "/v1/sandboxes/same", nil, 204, nil)
	a.wantError(a.do("GET", "/v1/sandboxes/same", nil), 404, wire.CodeNotFound)
	if _, err := os.Stat(sb.WorkspaceOnHost()); !os.IsNotExist(err) {
		t.Errorf("workspace after destroy: %v", err)
	}
	a.must("DELETE", "/v1/sandboxes/same", nil, 204, nil) // absent is success
	fresh := a.createSandbox("same")
	if fresh.Incarnation == sb.Incarnation {
		t.Errorf("re-create kept incarnation %s", sb.Incarnation)
	}
}

func sandboxEqual(a, b wire.Sandbox) bool {
	return a.Name == b.Name && a.Incarnation == b.Incarnation && a.State == b.State &&
		a.CreatedAt.Equal(b.CreatedAt) && a.Workspace == b.Workspace
}

func TestBadInput(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
	}{
		{"empty name", "POST", "/v1/sandboxes", `{"name":""}`, 400},
		{"upper case", "POST", "/v1/sandboxes", `{"name":"Box"}`, 400},
		{"leading dash", "POST", "/v1/sandboxes", `{"name":"-box"}`, 400},
		{"trailing dash", "POST", "/v1/sandboxes", `{"name":"box-"}`, 400},
		{"path trick", "POST", "/v1/sandboxes", `{"name":"../etc"}`, 400},
		{"dot", "POST", "/v1/sandboxes", `{"name":"a.b"}`, 400},
		{"64 chars", "POST", "/v1/sandboxes", fmt.Sprintf(`{"name":%q}`, strings.Repeat("a", 64)), 400},
		{"unknown field", "POST", "/v1/sandboxes", `{"name":"ok","nmae":"x"}`, 400},
		{"not json", "POST", "/v1/sandboxes", `{"name":`, 400},
		{"trailing data", "POST", "/v1/sandboxes", `{"name":"ok"} {}`, 400},
		{"too large", "POST", "/v1/sandboxes", `{"name":"` + strings.Repeat("a", 2<<20) + `"}`, 413},
		{"unknown user", "POST", "/v1/sandboxes", `{"name":"ok","user":"no-such-user-xyz"}`, 400},
		{"empty argv", "POST", "/v1/sandboxes/box/sessions", `{"argv":[]}`, 400},
		{"bad env", "POST", "/v1/sandboxes/box/sessions", `{"argv":["true"],"env":["NOEQUALS"]}`, 400},
		{"bad session id", "POST", "/v1/sandboxes/box/sessions", `{"id":"../x","argv":["true"]}`, 400},
		{"rows without tty", "POST", "/v1/sandboxes/box/sessions", `{"argv":["true"],"rows":3}`, 400},
		{"no such cwd", "POST", "/v1/sandboxes/box/sessions", `{"argv":["true"],"cwd":"nope"}`, 400},
		{"limit 0", "GET", "/v1/sandboxes?limit=0", nil, 400},
		{"limit 1001", "GET", "/v1/sandboxes?limit=1001", nil, 400},
		{"limit junk", "GET", "/v1/sandboxes?limit=x", nil, 400},
		{"bad page token", "GET", "/v1/sandboxes?page_token=%%%", nil, 400},
		{"bad page token 2", "GET", "/v1/sandboxes?page_token=Li4vZXRj", nil, 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a.t = t
			a.wantError(a.do(tt.method, tt.path, tt.body), tt.status, wire.CodeInvalid)
		})
	}
	a.t = t
	var page wire.SandboxList
	a.must("GET", "/v1/sandboxes", nil, 200, &page)
	if len(page.Sandboxes) != 1 {
		t.Errorf("bad creates left sandboxes: %+v", page.Sandboxes)
	}
}

func TestListPages(t *testing.T) {
	a := startDaemon(t)
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("sb-%d", 6-i)
		a.createSandbox(name)
		want = append(want, name)
	}
	slices.Sort(want)
	var got []string
	var sizes []int
	token := ""
	for range 10 {
		var page wire.SandboxList
		a.must("GET", "/v1/sandboxes?limit=3&page_token="+token, nil, 200, &page)
		sizes = append(sizes, len(page.Sandboxes))
		for _, sb := range page.Sandboxes {
			got = append(got, sb.Name)
		}
		token = page.NextPageToken
		if token == "" {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v", got, want)
	}
	if !slices.Equal(sizes, []int{3, 3, 1}) {
		t.Errorf("page sizes %v, want [3 3 1]", sizes)
	}
	// A response is complete JSON with a Content-Length.
	r := a.do("GET", "/v1/sandboxes", nil)
	if r.header.Get("Content-Length") == "" {
		t.Error("listing without Content-Length")
	}
}

func TestNotSupportedIsRefused(t *testing.T) {
	a := startDaemon(t)
	a.wantError(a.do("POST", "/v1/sandboxes", `{"name":"net","network":{"allow":[]}}`), http.StatusNotImplemented, wire.CodeNotSupported)
	a.wantError(a.do("GET", "/v1/sandboxes/net", nil), 404, wire.CodeNotFound)
	a.createSandbox("box")
	a.wantError(a.do("PUT", "/v1/sandboxes/box/network", `{"allow":[]}`), 501, wire.CodeNotSupported)
	a.wantError(a.do("POST", "/v1/sandboxes/box/urls", `{"port":8080}`), 501, wire.CodeNotSupported)
	a.wantError(a.do("PUT", "/v1/sandboxes/absent/network", `{"allow":[]}`), 404, wire.CodeNotFound)
}
