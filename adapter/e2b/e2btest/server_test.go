package e2btest_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/e2b/e2btest"
)

// These tests speak raw HTTP to the stand-in, independently of package
// e2b, so the stand-in's shapes are pinned on their own.

func do(t *testing.T, method, url string, h map[string]string, body []byte) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestControlPlaneShapes(t *testing.T) {
	s := e2btest.New(t, e2btest.Options{})
	key := map[string]string{"X-API-Key": s.APIKey, "Content-Type": "application/json"}

	resp, body := do(t, "POST", s.URL()+"/sandboxes", map[string]string{"X-API-Key": "e2b_wrong"}, []byte(`{"templateID":"t"}`))
	if resp.StatusCode != 401 || !strings.Contains(string(body), `"code":401`) {
		t.Errorf("wrong key: %d %s, want 401 with the Error schema", resp.StatusCode, body)
	}
	var ids []string
	for range 3 {
		resp, body = do(t, "POST", s.URL()+"/sandboxes", key, []byte(`{"templateID":"t","secure":true,"metadata":{"k":"v"}}`))
		var sb struct {
			SandboxID, EnvdAccessToken, EnvdVersion string
		}
		if resp.StatusCode != 201 || json.Unmarshal(body, &sb) != nil || sb.SandboxID == "" || sb.EnvdAccessToken == "" || sb.EnvdVersion != e2btest.EnvdVersion {
			t.Fatalf("create: %d %s", resp.StatusCode, body)
		}
		ids = append(ids, sb.SandboxID)
	}
	resp, body = do(t, "GET", s.URL()+"/sandboxes/nope", key, nil)
	if resp.StatusCode != 404 || !strings.Contains(string(body), `"code":404`) {
		t.Errorf("get unknown: %d %s, want 404 with the Error schema", resp.StatusCode, body)
	}
	resp, body = do(t, "GET", s.URL()+"/v2/sandboxes?limit=2&metadata=k%3Dv", key, nil)
	next := resp.Header.Get("X-Next-Token")
	if resp.StatusCode != 200 || next == "" || strings.Count(string(body), "sandboxID") != 2 {
		t.Fatalf("first page: %d next=%q %s", resp.StatusCode, next, body)
	}
	// Newest first: the last page holds the oldest.
	if !strings.Contains(string(body), ids[2]) || !strings.Contains(string(body), ids[1]) {
		t.Errorf("first page: %s; want the two newest, %s and %s", body, ids[2], ids[1])
	}
	resp, body = do(t, "GET", s.URL()+"/v2/sandboxes?limit=2&nextToken="+next, key, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Next-Token") != "" || strings.Count(string(body), "sandboxID") != 1 || !strings.Contains(string(body), ids[0]) {
		t.Errorf("last page: %d next=%q %s; want only %s and no cursor", resp.StatusCode, resp.Header.Get("X-Next-Token"), body, ids[0])
	}
	resp, _ = do(t, "GET", s.URL()+"/v2/sandboxes?limit=101", key, nil)
	if resp.StatusCode != 400 {
		t.Errorf("limit 101: %d, want 400", resp.StatusCode)
	}
	s.SetOutage(true)
	resp, _ = do(t, "GET", s.URL()+"/sandboxes/"+ids[0], key, nil)
	if resp.StatusCode != 503 {
		t.Errorf("outage: %d, want 503", resp.StatusCode)
	}
	s.SetOutage(false)
	if n := s.Requests("GET /v2/sandboxes"); n != 3 {
		t.Errorf("Requests counted %d lists, want 3", n)
	}
}

func frames(t *testing.T, b []byte) (msgs [][]byte, end []byte) {
	t.Helper()
	for len(b) > 0 {
		if len(b) < 5 {
			t.Fatalf("%d bytes left, less than a header", len(b))
		}
		n := binary.BigEndian.Uint32(b[1:5])
		msg := b[5 : 5+n]
		if b[0] == 2 {
			return msgs, msg
		}
		msgs = append(msgs, msg)
		b = b[5+n:]
	}
	t.Fatal("no end-stream message")
	return nil, nil
}

func TestEnvdStartRaw(t *testing.T) {
	s := e2btest.New(t, e2btest.Options{})
	_, body := do(t, "POST", s.URL()+"/sandboxes", map[string]string{"X-API-Key": s.APIKey}, []byte(`{"templateID":"t","secure":true}`))
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal(body, &sb); err != nil {
		t.Fatal(err)
	}
	h := map[string]string{
		"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken,
		"Connect-Protocol-Version": "1", "Content-Type": "application/connect+json",
	}
	req := []byte(`{"process":{"cmd":"head","args":["-c","100000","/dev/zero"]}}`)
	env := append([]byte{0, 0, 0, 0, byte(len(req))}, req...)
	resp, body := do(t, "POST", s.SandboxURL()+"/process.Process/Start", h, env)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("start: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	msgs, end := frames(t, body)
	if string(end) != "{}" {
		t.Errorf("end-stream %s, want {}", end)
	}
	var total int
	for i, m := range msgs {
		var ev struct {
			Event struct {
				Start *struct{ Pid uint32 }
				Data  *struct{ Stdout []byte }
				End   map[string]any
			}
		}
		if err := json.Unmarshal(m, &ev); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		switch {
		case i == 0:
			if ev.Event.Start == nil || ev.Event.Start.Pid == 0 {
				t.Errorf("first message %s, want start with a pid", m)
			}
		case i == len(msgs)-1:
			// protojson leaves the zero exit code and false out.
			if ev.Event.End == nil || ev.Event.End["status"] != "exit status 0" || ev.Event.End["exited"] != true || ev.Event.End["exitCode"] != nil {
				t.Errorf("last message %s, want end with status exit status 0 and no exitCode", m)
			}
		default:
			if ev.Event.Data == nil || len(ev.Event.Data.Stdout) > 32<<10 {
				t.Errorf("message %d: %d bytes of stdout, want a data event of at most 32 KiB", i, len(ev.Event.Data.Stdout))
			}
			total += len(ev.Event.Data.Stdout)
		}
	}
	if total != 100000 {
		t.Errorf("stdout totals %d bytes, want 100000", total)
	}

	delete(h, "X-Access-Token")
	resp, body = do(t, "POST", s.SandboxURL()+"/process.Process/List", map[string]string{
		"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "Connect-Protocol-Version": "1", "Content-Type": "application/json",
	}, []byte(`{}`))
	// envd's HTTP middleware answers, not Connect: a plain JSON 401.
	if want := `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}` + "\n"; resp.StatusCode != 401 || string(body) != want || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Errorf("list without the token: %d %s %q, want 401 %s", resp.StatusCode, resp.Header.Get("Content-Type"), body, want)
	}
	resp, _ = do(t, "POST", s.SandboxURL()+"/process.Process/List", map[string]string{"E2b-Sandbox-Id": "nope", "E2b-Sandbox-Port": "49983"}, nil)
	if resp.StatusCode != 502 {
		t.Errorf("unknown sandbox: %d, want the proxy's 502", resp.StatusCode)
	}
}

// createRaw creates a sandbox with body and returns its id and token.
func createRaw(t *testing.T, s *e2btest.Server, body string) (id, token string) {
	t.Helper()
	resp, b := do(t, "POST", s.URL()+"/sandboxes", map[string]string{"X-API-Key": s.APIKey, "Content-Type": "application/json"}, []byte(body))
	var sb struct{ SandboxID, EnvdAccessToken string }
	if resp.StatusCode != 201 || json.Unmarshal(b, &sb) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	return sb.SandboxID, sb.EnvdAccessToken
}

// TestTimeToLive: the control plane's time to live is 15 s by default
// (endAt - startedAt) and enforced: without autoPause an expired sandbox
// is gone (404), with it paused; the timeout call is 404 for a paused
// sandbox; connect resumes it (201) and, when running, answers 200.
func TestTimeToLive(t *testing.T) {
	key := map[string]string{"X-API-Key": "", "Content-Type": "application/json"}
	def := e2btest.New(t, e2btest.Options{})
	key["X-API-Key"] = def.APIKey
	id, token := createRaw(t, def, `{"templateID":"t"}`)
	if token != "" {
		t.Errorf("a sandbox created without secure has envd token %q, want none", token)
	}
	_, b := do(t, "GET", def.URL()+"/sandboxes/"+id, key, nil)
	var got struct{ StartedAt, EndAt time.Time }
	if err := json.Unmarshal(b, &got); err != nil || got.EndAt.Sub(got.StartedAt) != 15*time.Second {
		t.Errorf("default time to live: %s (%v), want endAt = startedAt + 15s", b, err)
	}

	s := e2btest.New(t, e2btest.Options{DefaultTimeout: 300 * time.Millisecond})
	key["X-API-Key"] = s.APIKey
	killed, _ := createRaw(t, s, `{"templateID":"t"}`)
	parked, _ := createRaw(t, s, `{"templateID":"t","autoPause":true}`)
	time.Sleep(600 * time.Millisecond)
	if resp, b := do(t, "GET", s.URL()+"/sandboxes/"+killed, key, nil); resp.StatusCode != 404 {
		t.Errorf("expired sandbox without autoPause: %d %s, want 404", resp.StatusCode, b)
	}
	resp, b := do(t, "GET", s.URL()+"/sandboxes/"+parked, key, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"state":"paused"`) {
		t.Fatalf("expired sandbox with autoPause: %d %s, want paused", resp.StatusCode, b)
	}
	if resp, b := do(t, "GET", s.URL()+"/v2/sandboxes", key, nil); !strings.Contains(string(b), parked) || strings.Contains(string(b), killed) {
		t.Errorf("listing: %d %s, want the paused sandbox and not the killed one", resp.StatusCode, b)
	}
	if resp, b := do(t, "POST", s.URL()+"/sandboxes/"+parked+"/timeout", key, []byte(`{"timeout":60}`)); resp.StatusCode != 404 {
		t.Errorf("timeout of a paused sandbox: %d %s, want 404", resp.StatusCode, b)
	}
	if resp, b := do(t, "POST", s.URL()+"/sandboxes/"+parked+"/connect", key, []byte(`{"timeout":60}`)); resp.StatusCode != 201 {
		t.Errorf("connect to a paused sandbox: %d %s, want 201 (resumed)", resp.StatusCode, b)
	}
	if resp, b := do(t, "POST", s.URL()+"/sandboxes/"+parked+"/connect", key, []byte(`{"timeout":1}`)); resp.StatusCode != 200 {
		t.Errorf("connect to a running sandbox: %d %s, want 200", resp.StatusCode, b)
	}
	time.Sleep(1200 * time.Millisecond) // connect only extends: 60 s stand
	if st, _ := s.State(parked); st != "running" {
		t.Errorf("after connect with a shorter timeout the sandbox is %q, want running (connect only extends)", st)
	}
	if resp, b := do(t, "POST", s.URL()+"/sandboxes/"+parked+"/timeout", key, []byte(`{"timeout":0}`)); resp.StatusCode != 204 {
		t.Errorf("timeout 0: %d %s, want 204", resp.StatusCode, b)
	}
	waitUntil(t, func() bool { st, _ := s.State(parked); return st == "paused" })
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("timed out")
		}
	}
}

// recTB records Errorf instead of failing, to watch the stand-in fail a
// test.
type recTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// startRaw starts cmd through the Connect protocol and returns the
// response; h adds headers.
func startRaw(t *testing.T, s *e2btest.Server, id, token, req string, h map[string]string) (*http.Response, []byte) {
	t.Helper()
	hdr := map[string]string{
		"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token,
		"Connect-Protocol-Version": "1", "Content-Type": "application/connect+json",
	}
	for k, v := range h {
		hdr[k] = v
	}
	env := append([]byte{0, 0, 0, 0, byte(len(req))}, req...)
	r, err := http.NewRequestWithContext(t.Context(), "POST", s.SandboxURL()+"/process.Process/Start", bytes.NewReader(env))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestKeepalives: a Keepalive-Ping-Interval of 0 crashes real envd
// (time.NewTicker panics): the stand-in fails the test that sent it and
// cuts the connection. Keepalives come every interval, restarted by each
// data event.
func TestKeepalives(t *testing.T) {
	rec := &recTB{TB: t}
	s := e2btest.New(rec, e2btest.Options{})
	id, token := createRaw(t, s, `{"templateID":"t","secure":true}`)
	resp, _ := startRaw(t, s, id, token, `{"process":{"cmd":"true"}}`, map[string]string{"Keepalive-Ping-Interval": "0"})
	if resp != nil {
		t.Errorf("Keepalive-Ping-Interval: 0 answered %d, want the connection cut", resp.StatusCode)
	}
	rec.mu.Lock()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "crashes real envd") {
		t.Errorf("stand-in errors %q, want one naming the crash", rec.errs)
	}
	rec.mu.Unlock()

	// Output every 0.3 s under a 1 s interval: the ticker restarts at each
	// data event, so no keepalive; then 2.5 s of silence: two.
	_, b := startRaw(t, s, id, token, `{"process":{"cmd":"/bin/sh","args":["-c","for i in 1 2 3 4 5; do echo $i; sleep 0.3; done; sleep 2.5"]}}`,
		map[string]string{"Keepalive-Ping-Interval": "1"})
	if n := bytes.Count(b, []byte(`"keepalive"`)); n != 2 {
		t.Errorf("%d keepalives, want 2 (none between data events 0.3 s apart, two in 2.5 s of silence): %s", n, b)
	}
}

// TestUploadAnswer: envd answers an upload 200 with its JSON list and no
// declared type (Go's sniffing makes it text/plain).
func TestUploadAnswer(t *testing.T) {
	s := e2btest.New(t, e2btest.Options{})
	id, token := createRaw(t, s, `{"templateID":"t","secure":true}`)
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", "f.txt")
	fw.Write([]byte("hi"))
	mw.Close()
	resp, b := do(t, "POST", s.SandboxURL()+"/files?path=f.txt", map[string]string{
		"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token, "Content-Type": mw.FormDataContentType(),
	}, body.Bytes())
	dir, _ := s.Dir(id)
	want := `[{"name":"f.txt","path":"` + dir + `/f.txt","type":"file"}]`
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" || string(b) != want {
		t.Errorf("upload: %d %q %s, want 200 text/plain; charset=utf-8 %s", resp.StatusCode, resp.Header.Get("Content-Type"), b, want)
	}
}
