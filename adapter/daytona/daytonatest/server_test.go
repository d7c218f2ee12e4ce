package daytonatest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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
	code, b := req(t, s, "POST", s.URL()+"/sandbox", `{"name":"n`+randHex(4)+`"}`)
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
	sid := "s" + randHex(4)
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
