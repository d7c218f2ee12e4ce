package daemon_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/wire"
)

// concurrently runs n requests at once (released together) and counts the
// answers by status; any other answer than ok or 503 exhausted fails t.
func concurrently(t *testing.T, a *api, n, okStatus int, req func(i int) (string, string, any)) (ok, exhausted int) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			method, path, body := req(i)
			r := a.do(method, path, body)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.status == okStatus:
				ok++
			case r.status == http.StatusServiceUnavailable && r.errBody(t).Exhausted:
				exhausted++
			default:
				t.Errorf("request %d: %d %s", i, r.status, r.body)
			}
		})
	}
	close(start)
	wg.Wait()
	return ok, exhausted
}

// TestAdmissionExactSandboxes: with 2 free places, 10 concurrent creates
// admit exactly 2 (a create in flight whose record is committed is
// counted once, not as a record and as in flight), and never 3.
func TestAdmissionExactSandboxes(t *testing.T) {
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		Capacity: daemon.CapacityLimits{MaxSandboxes: 3}})
	a.createSandbox("held")
	for round := range 3 {
		ok, full := concurrently(t, a, 10, http.StatusOK, func(i int) (string, string, any) {
			return "POST", "/v1/sandboxes", wire.CreateSandbox{Name: fmt.Sprintf("r%d-c%d", round, i)}
		})
		if ok != 2 || full != 8 {
			t.Fatalf("round %d: 10 concurrent creates with 2 free places: %d created, %d exhausted; want 2, 8", round, ok, full)
		}
		var list wire.SandboxList
		a.must("GET", "/v1/sandboxes", nil, 200, &list)
		if len(list.Sandboxes) != 3 {
			t.Fatalf("round %d: %d sandboxes, want 3", round, len(list.Sandboxes))
		}
		for _, sb := range list.Sandboxes {
			if sb.Name != "held" {
				a.must("DELETE", "/v1/sandboxes/"+sb.Name, nil, 204, nil)
			}
		}
	}
}

// TestAdmissionExactSessions: 30 concurrent spawns against
// MaxSessions 20 start exactly 20.
func TestAdmissionExactSessions(t *testing.T) {
	a := startDaemonCfg(t, daemon.Config{StateDir: t.TempDir(), Token: testToken, NetPolicy: daemon.NetPolicyOff,
		Capacity: daemon.CapacityLimits{MaxSessions: 20}})
	a.createSandbox("box")
	ok, full := concurrently(t, a, 30, http.StatusCreated, func(i int) (string, string, any) {
		req := wire.CreateSession{Argv: []string{"sleep", "60"}}
		if i%2 == 0 {
			req.ID = fmt.Sprintf("s%d", i) // half with ids, half named by runnerd
		}
		return "POST", "/v1/sandboxes/box/sessions", req
	})
	if ok != 20 || full != 10 {
		t.Fatalf("30 concurrent spawns against 20 places: %d started, %d exhausted; want 20, 10", ok, full)
	}
}
