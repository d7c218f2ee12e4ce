package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// listAllSessions pages through GET .../sessions limit at a time and
// returns every page's sessions in order, failing on a repeated token.
func listAllSessions(a *api, sandbox string, limit int) []wire.Session {
	a.t.Helper()
	var all []wire.Session
	token := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			a.t.Fatal("listing does not end")
		}
		var page wire.SessionList
		a.must("GET", fmt.Sprintf("/v1/sandboxes/%s/sessions?limit=%d&page_token=%s", sandbox, limit, url.QueryEscape(token)), nil, 200, &page)
		if len(page.Sessions) > limit {
			a.t.Fatalf("page of %d sessions, limit %d", len(page.Sessions), limit)
		}
		all = append(all, page.Sessions...)
		if page.NextPageToken == "" {
			return all
		}
		if page.NextPageToken == token {
			a.t.Fatalf("token %q repeated", token)
		}
		token = page.NextPageToken
	}
}

// TestListSessionsPaging: 250 sessions (running and ended) list page by
// page in start order, each exactly once, whatever the page size; a token
// of another sandbox, of an earlier incarnation of the same name, or a
// malformed one is 400 invalid, never a silently shorter listing.
func TestListSessionsPaging(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	a.createSandbox("other")
	const n = 250
	var want []string
	for i := range n {
		// Ids descend while start times ascend: an id-ordered listing
		// comes out reversed.
		id := fmt.Sprintf("turn-%03d", n-i)
		argv := []string{"sleep", "600"}
		if i%10 == 0 {
			argv = []string{"true"}
		}
		a.spawn("box", wire.CreateSession{ID: id, Argv: argv})
		want = append(want, id)
	}
	a.spawn("other", wire.CreateSession{ID: "o-1", Argv: []string{"true"}})
	a.spawn("other", wire.CreateSession{ID: "o-2", Argv: []string{"true"}})

	for _, limit := range []int{1, 7, 100, 1000} {
		got := listAllSessions(a, "box", limit)
		ids := make([]string, 0, len(got))
		for _, s := range got {
			ids = append(ids, s.ID)
			if s.Sandbox != "box" {
				t.Errorf("limit %d: session %s of sandbox %q", limit, s.ID, s.Sandbox)
			}
		}
		if strings.Join(ids, ",") != strings.Join(want, ",") {
			t.Errorf("limit %d: got %d sessions %v\nwant %d in start order %v", limit, len(ids), ids, len(want), want)
		}
	}
	var def wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &def)
	if len(def.Sessions) != wire.DefaultListLimit || def.NextPageToken == "" {
		t.Errorf("default page: got %d sessions, token %q; want %d and a token", len(def.Sessions), def.NextPageToken, wire.DefaultListLimit)
	}

	var page wire.SessionList
	a.must("GET", "/v1/sandboxes/other/sessions?limit=1", nil, 200, &page)
	if page.NextPageToken == "" {
		t.Fatal("no token for the first of two sessions")
	}
	otherTok := page.NextPageToken
	a.must("GET", "/v1/sandboxes/box/sessions?limit=3", nil, 200, &page)
	boxTok := page.NextPageToken
	for _, tc := range []struct{ name, query string }{
		{"another sandbox's token", "page_token=" + otherTok},
		{"malformed token", "page_token=%21%21"},
		{"token of no listing", "page_token=" + "eyJ4IjoxfQ"},
		{"limit 0", "limit=0"},
		{"limit too large", "limit=1001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.wantError(a.do("GET", "/v1/sandboxes/box/sessions?"+tc.query, nil), 400, wire.CodeInvalid)
		})
	}
	// The same name, a new incarnation: the old listing's place means
	// nothing in it.
	a.must("DELETE", "/v1/sandboxes/box", nil, 204, nil)
	a.createSandbox("box")
	a.spawn("box", wire.CreateSession{ID: "turn-999", Argv: []string{"true"}})
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions?page_token="+boxTok, nil), 400, wire.CodeInvalid)
}

// TestListSessionsStoppedShims: a listing while shims are SIGSTOPped (they
// accept a connection and never answer) answers promptly and complete,
// the stopped sessions as the registry and their journal files say:
// running, with their lengths, no status_error. A GET of one of them may
// still ask its shim; the listing never does.
func TestListSessionsStoppedShims(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	var stopped []int
	t.Cleanup(func() {
		for _, pid := range stopped {
			syscall.Kill(pid, syscall.SIGCONT) // before the destroy of startDaemon's cleanup
		}
	})
	for i := range 5 {
		id := fmt.Sprintf("s%d", i)
		a.spawn("box", wire.CreateSession{ID: id, Argv: []string{"sh", "-c", "printf abc; exec sleep 600"}})
		b, err := os.ReadFile(filepath.Join(sessionDirOf(t, a.state, id), sessiondir.PIDFile))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		// Wait for the output so the lengths are known before the stop.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var s wire.Session
			a.must("GET", "/v1/sandboxes/box/sessions/"+id, nil, 200, &s)
			if s.Lengths["stdout"] == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s: lengths %v", id, s.Lengths)
			}
		}
		if i%2 == 1 {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped = append(stopped, pid)
	}
	start := time.Now()
	var list wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &list)
	// Each stopped shim cost a listing that asked it 2 s: 6 s for three.
	// The bound is far above a registry read on a loaded machine.
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("listing with %d stopped shims took %v", len(stopped), d)
	}
	if len(list.Sessions) != 5 {
		t.Fatalf("got %d sessions, want 5: %+v", len(list.Sessions), list.Sessions)
	}
	for i, s := range list.Sessions {
		if s.ID != fmt.Sprintf("s%d", i) || s.State != wire.SessionRunning || s.StatusError != "" {
			t.Errorf("entry %d: got id %s state %s status_error %q, want s%d running and none", i, s.ID, s.State, s.StatusError, i)
		}
		if s.Lengths["stdout"] != 3 {
			t.Errorf("session %s: lengths %v, want stdout 3 from its journal", s.ID, s.Lengths)
		}
	}
}

// TestDestroyManySessions: destroying a sandbox with 200 running sessions
// ends every command and answers 204, not uncertain.
func TestDestroyManySessions(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("big")
	const n = 200
	pids := make([]int, 0, n)
	for i := range n {
		s := a.spawn("big", wire.CreateSession{ID: fmt.Sprintf("t%03d", i), Argv: []string{"sleep", "600"}})
		pids = append(pids, s.PID)
	}
	r := a.do("DELETE", "/v1/sandboxes/big", nil)
	if r.status != 204 {
		t.Fatalf("destroy of %d sessions: got %d %s, want 204", n, r.status, r.body)
	}
	for _, pid := range pids {
		if err := processGone(pid, 5*time.Second); err != nil {
			t.Error(err)
		}
	}
	a.wantError(a.do("GET", "/v1/sandboxes/big", nil), 404, wire.CodeNotFound)
}

// TestRaisesDescriptorLimit: runnerd started with a soft RLIMIT_NOFILE
// below its hard limit runs with the soft limit raised to the hard one.
func TestRaisesDescriptorLimit(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		testcap.Skip(t, "prlimit", "util-linux prlimit starts runnerd with a low descriptor limit")
	}
	_, p := startProcessWrapped(t, t.TempDir(), []string{prlimit, "--nofile=256:4096", "--"})
	soft, hard := noFileLimits(t, p.cmd.Process.Pid)
	if soft != "4096" || hard != "4096" {
		t.Errorf("runnerd's RLIMIT_NOFILE: soft %s hard %s, want 4096 and 4096", soft, hard)
	}
}

// noFileLimits reads the soft and hard "Max open files" of pid.
func noFileLimits(t *testing.T, pid int) (soft, hard string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			f := strings.Fields(strings.TrimPrefix(line, "Max open files"))
			if len(f) >= 2 {
				return f[0], f[1]
			}
		}
	}
	t.Fatalf("no Max open files in %s", b)
	return "", ""
}

// TestAttachRefusedWithoutDescriptors: a runnerd whose descriptors run
// out refuses further attaches (and stream reads) with 503 unavailable,
// the Runner-Error header and the JSON error body, before the WebSocket
// upgrade, while every attach it accepted keeps being served; once the
// attaches end it accepts again.
func TestAttachRefusedWithoutDescriptors(t *testing.T) {
	a, p := startProcess(t, t.TempDir())
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{ID: "talk", Argv: []string{"sh", "-c", "echo hi; exec sleep 600"}})
	pid := p.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Soft and hard: room for a handful of attaches past the reserve.
	limit := uint64(len(fds) + 100)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatal(err)
	}

	url := strings.Replace(a.base, "http", "ws", 1) + "/v1/sandboxes/box/sessions/" + sess.ID + "/attach"
	opts := &websocket.DialOptions{HTTPClient: a.hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + a.token}}}
	var open []*websocket.Conn
	defer func() {
		for _, c := range open {
			c.CloseNow()
		}
	}()
	var refused *http.Response
	for i := 0; i < int(limit) && refused == nil; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, resp, err := websocket.Dial(ctx, url, opts)
		if err != nil {
			cancel()
			if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("attach %d: %v (response %v), want an upgrade or 503", i, err, resp)
			}
			refused = resp
			break
		}
		// An accepted attach is served: it delivers the output.
		_, msg, err := c.Read(ctx)
		cancel()
		if err != nil {
			t.Fatalf("attach %d accepted but not served: %v", i, err)
		}
		if !strings.HasSuffix(string(msg), "hi\n") {
			t.Fatalf("attach %d: first frame %q, want the output hi", i, msg)
		}
		open = append(open, c)
	}
	if refused == nil {
		t.Fatalf("%d attaches under a limit of %d descriptors, none refused", len(open), limit)
	}
	t.Logf("%d attaches accepted, then refused", len(open))
	body, _ := io.ReadAll(refused.Body)
	var eb wire.ErrorBody
	if refused.Header.Get(wire.HeaderError) != string(wire.CodeUnavailable) || json.Unmarshal(body, &eb) != nil || eb.Error.Code != wire.CodeUnavailable {
		t.Errorf("refusal: header %q body %q, want %s in both", refused.Header.Get(wire.HeaderError), body, wire.CodeUnavailable)
	}
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/"+sess.ID+"/streams/stdout", nil), 503, wire.CodeUnavailable)
	// Calls that end still work.
	a.must("GET", "/v1/sandboxes/box/sessions/"+sess.ID, nil, 200, nil)

	for _, c := range open {
		c.Close(websocket.StatusNormalClosure, "")
	}
	open = nil
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, resp, err := websocket.Dial(ctx, url, opts)
		cancel()
		if err == nil {
			c.CloseNow()
			break
		}
		if resp == nil || resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("attach after the others closed: %v", err)
		}
	}
}
