package daytonatest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// req sends one request with the stand-in's key and returns status and body.
func req(t *testing.T, s *Server, method, url, body string) (int, []byte) {
	t.Helper()
	r, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+s.APIKey)
	r.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// startedSandbox creates a sandbox through the API and waits for started.
func startedSandbox(t *testing.T, s *Server) string {
	t.Helper()
	code, b := req(t, s, "POST", s.URL()+"/sandbox", `{"name":"n`+standin.RandHex(4)+`"}`)
	if code != 200 {
		t.Fatalf("create: %d %s", code, b)
	}
	var sb struct{ ID, State string }
	_ = json.Unmarshal(b, &sb)
	for deadline := time.Now().Add(5 * time.Second); sb.State != "started"; {
		if time.Now().After(deadline) {
			t.Fatalf("never started")
		}
		time.Sleep(10 * time.Millisecond)
		_, b = req(t, s, "GET", s.URL()+"/sandbox/"+sb.ID, "")
		_ = json.Unmarshal(b, &sb)
	}
	return sb.ID
}

// spawn starts `sh -c 'echo $$ > pidfile; exec sleep 1000'` in a new
// session of sandbox id and returns the sleep's pid.
func spawn(t *testing.T, s *Server, id string) int {
	t.Helper()
	tb := s.ToolboxProxyURL() + "/" + id
	sid := "s" + standin.RandHex(4)
	if code, b := req(t, s, "POST", tb+"/process/session", `{"sessionId":"`+sid+`"}`); code != 201 {
		t.Fatalf("create session: %d %s", code, b)
	}
	if code, b := req(t, s, "POST", tb+"/process/session/"+sid+"/exec", `{"command":"sh -c 'echo $$ > `+sid+`.pid; exec sleep 1000'","runAsync":true}`); code != 202 {
		t.Fatalf("exec: %d %s", code, b)
	}
	home, _ := s.Home(id)
	for deadline := time.Now().Add(5 * time.Second); ; {
		b, _ := os.ReadFile(filepath.Join(home, sid+".pid"))
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); running(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("process %d survived %s", pid, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestShutdownEndsEveryProcess(t *testing.T) {
	var pid int
	t.Run("stand-in", func(t *testing.T) {
		s := New(t, Options{})
		pid = spawn(t, s, startedSandbox(t, s))
		if !running(pid) {
			t.Fatalf("sleep %d is not running", pid)
		}
	})
	waitGone(t, pid, "the stand-in's cleanup")
}

func TestStopEndsProcessesKeepsDisk(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	pid := spawn(t, s, id)
	home, _ := s.Home(id)
	if code, b := req(t, s, "POST", s.URL()+"/sandbox/"+id+"/stop", ""); code != 200 {
		t.Fatalf("stop: %d %s", code, b)
	}
	waitGone(t, pid, "stop")
	if _, err := os.Stat(home); err != nil {
		t.Fatalf("the disk did not survive stop: %v", err)
	}
	// The toolbox proxy cannot reach it: a bare 502.
	code, b := req(t, s, "POST", s.ToolboxProxyURL()+"/"+id+"/process/execute", `{"command":"true"}`)
	if code != http.StatusBadGateway || bytes.Contains(b, []byte("statusCode")) {
		t.Fatalf("toolbox of a stopped sandbox: got %d %s, want a bare 502", code, b)
	}
}

func TestDeleteEndsProcesses(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	pid := spawn(t, s, id)
	if code, b := req(t, s, "DELETE", s.URL()+"/sandbox/"+id, ""); code != 200 {
		t.Fatalf("delete: %d %s", code, b)
	}
	waitGone(t, pid, "delete")
}

func TestAuth(t *testing.T) {
	s := New(t, Options{})
	r, _ := http.NewRequest("GET", s.URL()+"/sandbox/x", nil)
	r.Header.Set("Authorization", "Bearer wrong")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong key: got %d, want 401", resp.StatusCode)
	}
}

// TestDaemonErrorShapes pins each error answer of the toolbox as daemon
// v0.190.0 gives it: status, content type and body (timestamps aside).
func TestDaemonErrorShapes(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	tb := s.ToolboxProxyURL() + "/" + id
	if code, b := req(t, s, "POST", tb+"/process/session", `{"sessionId":"s.1"}`); code != 201 {
		t.Fatalf("create s.1: %d %s", code, b)
	}
	stamp := regexp.MustCompile(`"timestamp":"[^"]*"`)
	cases := []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		{"unknown route", "GET", "/no/such/route", "", 404, "404 page not found"},
		{"exec in an unknown session", "POST", "/process/session/nope/exec", `{"command":"true","runAsync":true}`, 500,
			`{"message":"failed to execute command: not found: session not found","path":"","statusCode":500,"timestamp":""}`},
		{"exec of an empty command", "POST", "/process/session/s.1/exec", `{"command":"  "}`, 400, ""},
		{"exec of a bad body", "POST", "/process/session/s.1/exec", `{bad`, 400, ""},
		{"command of an unknown session", "GET", "/process/session/nope/command/c", "", 404,
			`{"code":"NOT_FOUND","message":"not found: session not found","method":"GET","path":"/process/session/nope/command/c","statusCode":404,"timestamp":""}`},
		{"session taken", "POST", "/process/session", `{"sessionId":"s.1"}`, 409,
			`{"code":"CONFLICT","message":"conflict: session already exists","method":"POST","path":"/process/session","statusCode":409,"timestamp":""}`},
		{"download of a missing file", "GET", "/files/download?path=/nonexist", "", 404, ""},
		{"upload without a path", "POST", "/files/upload", "", 400, ""},
		{"execute of an empty command", "POST", "/process/execute", `{"command":" "}`, 400,
			`{"code":"BAD_REQUEST","message":"bad request: command cannot be empty or whitespace-only","method":"POST","path":"/process/execute","statusCode":400,"timestamp":""}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, b := req(t, s, tc.method, tb+tc.path, tc.body)
			got := string(b)
			if strings.HasPrefix(got, "{") {
				var m map[string]any
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatal(err)
				}
				nb, _ := json.Marshal(m) // keys sorted
				got = stamp.ReplaceAllString(string(nb), `"timestamp":""`)
			}
			if code != tc.status || got != tc.want {
				t.Fatalf("got %d %s, want %d %s", code, got, tc.status, tc.want)
			}
		})
	}
}
