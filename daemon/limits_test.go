package daemon_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/ostest"
	"github.com/agentrunner/runner/wire"
)

// holdExec starts an exec that runs until release is called, and waits
// until its command runs (so it holds the only slot of a daemon started
// with MaxExecs 1); it returns the answer to one more exec.
func holdExec(t *testing.T, a *api, sb wire.Sandbox) (limited response, release func()) {
	t.Helper()
	flag := filepath.Join(sb.WorkspaceOnHost(), "release")
	raw, _ := json.Marshal(wire.Exec{Argv: []string{"sh", "-c", "touch started; while [ ! -e release ]; do sleep 0.05; done"}})
	req, err := http.NewRequest("POST", a.base+"/v1/sandboxes/"+sb.Name+"/exec", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	held := make(chan int, 1)
	go func() {
		resp, err := a.hc.Do(req)
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	release = func() {
		t.Helper()
		if err := os.WriteFile(flag, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := <-held; got != 200 {
			t.Errorf("held exec: got %d, want 200", got)
		}
	}
	ostest.WaitFile(t, filepath.Join(sb.WorkspaceOnHost(), "started"), 20*time.Second, release, "the held exec never started")
	return a.do("POST", "/v1/sandboxes/"+sb.Name+"/exec", wire.Exec{Argv: []string{"true"}}), release
}

func TestExecConcurrencyBound(t *testing.T) {
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff, MaxExecs: 1})
	sb := a.createSandbox("box")
	r, release := holdExec(t, a, sb)
	a.wantError(r, http.StatusTooManyRequests, wire.CodeRateLimited)
	if got := r.errBody(t).RetryAfterMS; got != 1000 {
		t.Errorf("retry_after_ms: got %d, want 1000", got)
	}
	if got := r.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After: got %q, want %q", got, "1")
	}
	release()
	// The slot is given back: the next exec runs.
	if res := a.exec("box", wire.Exec{Argv: []string{"echo", "ok"}}); string(res.Stdout) != "ok\n" {
		t.Errorf("exec after release: got %q, want %q", res.Stdout, "ok\n")
	}
	m := a.do("GET", "/metrics", nil)
	if !strings.Contains(string(m.body), `runnerd_errors_total{code="rate_limited"} `) || strings.Contains(string(m.body), `runnerd_errors_total{code="rate_limited"} 0`+"\n") {
		t.Errorf("metrics do not count the rate_limited answer:\n%s", m.body)
	}
}

// TestStdinLooksUpSessionFirst: a stdin body larger than the limit for a
// session that does not exist, or has ended, is answered by what is wrong
// with the session, not by reading (and refusing) the body.
func TestStdinLooksUpSessionFirst(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	big := bytes.Repeat([]byte("x"), wire.MaxStdinBody+1)
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/nope/stdin", big), http.StatusNotFound, wire.CodeNotFound)

	res := a.exec("box", wire.Exec{ID: "done", Argv: []string{"true"}})
	if res.Exit.Reason != "exited" {
		t.Fatalf("exec: got exit %+v", res.Exit)
	}
	r := a.do("POST", "/v1/sandboxes/box/sessions/done/stdin", big)
	if r.status == http.StatusRequestEntityTooLarge {
		t.Fatalf("ended session: got %d %s, want the session's state, not the body's size", r.status, r.body)
	}
	a.wantError(r, http.StatusConflict, wire.CodeCommandExited)
	// A live session still takes its stdin.
	s := a.spawn("box", wire.CreateSession{Argv: []string{"cat"}})
	if r := a.do("POST", "/v1/sandboxes/box/sessions/"+s.ID+"/stdin", "hi\n"); r.status != http.StatusNoContent {
		t.Errorf("stdin to a live session: got %d %s, want 204", r.status, r.body)
	}
	// And refuses a body over the limit.
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/"+s.ID+"/stdin", big), http.StatusRequestEntityTooLarge, wire.CodeInvalid)
}
