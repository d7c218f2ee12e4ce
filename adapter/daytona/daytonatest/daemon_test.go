package daytonatest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The stand-in's behaviour on each point where it follows daemon
// v0.190.0 (checked against one built from that tag), a test per point.

// newSession creates a session in sandbox id and returns the toolbox base URL.
func newSession(t *testing.T, s *Server, id, sid string) string {
	t.Helper()
	tb := s.ToolboxProxyURL() + "/" + id
	if code, b := req(t, s, "POST", tb+"/process/session", `{"sessionId":"`+sid+`"}`); code != 201 {
		t.Fatalf("create session %s: %d %s", sid, code, b)
	}
	return tb
}

// execAsync runs command in session sid and returns its id.
func execAsync(t *testing.T, s *Server, tb, sid, command string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command, "runAsync": true})
	code, b := req(t, s, "POST", tb+"/process/session/"+sid+"/exec", string(body))
	var r struct{ CmdID string }
	if code != 202 || json.Unmarshal(b, &r) != nil || r.CmdID == "" {
		t.Fatalf("exec %q: %d %s", command, code, b)
	}
	return r.CmdID
}

// waitCode polls a command's record until it has an exit code.
func waitCode(t *testing.T, s *Server, tb, sid, cid string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		code, b := req(t, s, "GET", tb+"/process/session/"+sid+"/command/"+cid, "")
		var c struct{ ExitCode *int }
		if code == 200 && json.Unmarshal(b, &c) == nil && c.ExitCode != nil {
			return *c.ExitCode
		}
	}
	t.Fatalf("command %s never exited", cid)
	return 0
}

func TestShellChoice(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, shells string
		env          string // SHELL; "-": unset
		want         string
	}{
		{"zsh first", "/bin/sh\n/bin/bash\n/usr/bin/zsh\n", "-", "/usr/bin/zsh"},
		{"zsh in /bin", "/bin/bash\n/bin/zsh\n", "-", "/bin/zsh"},
		{"bash", "/bin/sh\n/usr/bin/bash\n", "-", "/usr/bin/bash"},
		{"commented out", "# /usr/bin/zsh\n/bin/bash\n", "-", "/bin/bash"},
		{"none known: $SHELL", "/bin/sh\n", "/bin/dash", "/bin/dash"},
		{"none known, no $SHELL", "/bin/sh\n", "-", "sh"},
		{"no file", "", "/bin/dash", "sh"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strconv.Itoa(i))
			if tc.shells != "" {
				if err := os.WriteFile(f, []byte(tc.shells), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.env == "-" {
				t.Setenv("SHELL", "")
				os.Unsetenv("SHELL")
			} else {
				t.Setenv("SHELL", tc.env)
			}
			s := &Server{opts: Options{ShellsFile: f}}
			if got := s.shell(); got != tc.want {
				t.Fatalf("shell = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestLogFormatFollowsHeaders: the log answer as X-Daytona-SDK-Version and
// X-Daytona-Split-Output choose it; plain text keeps invalid UTF-8 raw,
// JSON replaces it.
func TestLogFormatFollowsHeaders(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	tb := newSession(t, s, id, "logs")
	// The pause orders the lines: the two streams' loops write the log
	// independently.
	cid := execAsync(t, s, tb, "logs", `printf '\377y\n'; sleep 0.2; echo e >&2`)
	waitCode(t, s, tb, "logs", cid)
	cases := []struct {
		name      string
		sdk       string
		split     bool
		want, typ string
	}{
		{"no header", "", false, "\xffy\ne\n", "text/plain; charset=utf-8"},
		{"split", "", true, "\x01\x01\x01\xffy\n\x02\x02\x02e\n", "text/plain; charset=utf-8"},
		{"SDK before 0.27: combined, split ignored", "0.20.0", true, "\xffy\ne\n", "text/plain; charset=utf-8"},
		{"SDK 0.100: split without asking", "0.100.0", false, "\x01\x01\x01\xffy\n\x02\x02\x02e\n", "text/plain; charset=utf-8"},
		{"SDK 0.170: JSON", "0.170.0", false, `{"output":"\u0001\u0001\u0001\ufffdy\n\u0002\u0002\u0002e\n","stderr":"e\n","stdout":"\ufffdy\n"}`, "application/json; charset=utf-8"},
		{"dev SDK: JSON", "0.0.0-dev", false, `{"output":"\u0001\u0001\u0001\ufffdy\n\u0002\u0002\u0002e\n","stderr":"e\n","stdout":"\ufffdy\n"}`, "application/json; charset=utf-8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", tb+"/process/session/logs/command/"+cid+"/logs", nil)
			r.Header.Set("Authorization", "Bearer "+s.APIKey)
			if tc.sdk != "" {
				r.Header.Set("X-Daytona-SDK-Version", tc.sdk)
			}
			if tc.split {
				r.Header.Set("X-Daytona-Split-Output", "true")
			}
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var buf bytes.Buffer
			buf.ReadFrom(resp.Body)
			if resp.StatusCode != 200 || buf.String() != tc.want || resp.Header.Get("Content-Type") != tc.typ {
				t.Fatalf("got %d %q (%s), want %q (%s)", resp.StatusCode, buf.String(), resp.Header.Get("Content-Type"), tc.want, tc.typ)
			}
		})
	}
}

// tagged returns the pids of processes running exactly argv with the
// stand-in's tag for sandbox id.
func tagged(id string, argv string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !running(pid) {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		env, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		if string(bytes.TrimRight(cmd, "\x00")) == strings.ReplaceAll(argv, " ", "\x00") && bytes.Contains(env, []byte(TagEnv+"="+id+"\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

// TestAsyncCommandLeavesStdinHolder: each async command leaves a
// `sleep 3600` (its stdin holder's) until the session is deleted; a
// synchronous one leaves none.
func TestAsyncCommandLeavesStdinHolder(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	tb := newSession(t, s, id, "h")
	// The daemon's exit-code race (a 500 "failed to convert exit code",
	// reproduced by the stand-in and hit under load) says nothing about
	// holders: ask again, as the adapter does.
	for try := 0; ; try++ {
		code, b := req(t, s, "POST", tb+"/process/session/h/exec", `{"command":"true"}`)
		if code == 200 {
			break
		}
		if try == 5 || code != 500 || !strings.Contains(string(b), "failed to convert exit code") {
			t.Fatalf("sync exec: %d %s", code, b)
		}
	}
	if n := len(tagged(id, "sleep 3600")); n != 0 {
		t.Fatalf("after a sync command: %d holders, want 0", n)
	}
	for range 2 {
		// Long enough for the holder's loop to have started its sleep.
		waitCode(t, s, tb, "h", execAsync(t, s, tb, "h", "sleep 0.3"))
	}
	if n := len(tagged(id, "sleep 3600")); n != 2 {
		t.Fatalf("after two async commands: %d holders, want 2", n)
	}
	if code, b := req(t, s, "DELETE", tb+"/process/session/h", ""); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	for _, pid := range tagged(id, "sleep 3600") {
		waitGone(t, pid, "its session")
	}
}

// TestDeleteSession: DELETE answers after the first termination check
// (100 ms) at best; it SIGTERMs what left the process group (a setsid
// child, found by walking the tree); something that ignores SIGTERM gets
// SIGKILL after the 5 s grace.
func TestDeleteSession(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	home, _ := s.Home(id)
	tb := newSession(t, s, id, "idle")
	start := time.Now()
	if code, _ := req(t, s, "DELETE", tb+"/process/session/idle", ""); code != 204 {
		t.Fatalf("delete idle: %d", code)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 2*time.Second {
		t.Fatalf("delete of an idle session took %v, want one 100 ms check", d)
	}
	tb = newSession(t, s, id, "tree")
	execAsync(t, s, tb, "tree", `setsid sh -c 'echo $$ > esc.pid; exec sleep 100' & wait`)
	pid := waitPid(t, filepath.Join(home, "esc.pid"))
	start = time.Now()
	if code, _ := req(t, s, "DELETE", tb+"/process/session/tree", ""); code != 204 {
		t.Fatalf("delete tree: %d", code)
	}
	waitGone(t, pid, "SIGTERM through the tree")
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("a SIGTERM-able tree took %v, want no SIGKILL escalation", d)
	}
	tb = newSession(t, s, id, "deaf")
	execAsync(t, s, tb, "deaf", `trap '' TERM; echo $$ > deaf.pid; sleep 30`)
	pid = waitPid(t, filepath.Join(home, "deaf.pid"))
	start = time.Now()
	if code, _ := req(t, s, "DELETE", tb+"/process/session/deaf", ""); code != 204 {
		t.Fatalf("delete deaf: %d", code)
	}
	if d := time.Since(start); d < 5*time.Second || d > 7*time.Second {
		t.Fatalf("delete of a session ignoring SIGTERM took %v, want the 5 s grace", d)
	}
	waitGone(t, pid, "SIGKILL after the grace")
}

func waitPid(t *testing.T, file string) int {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(file)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return pid
		}
	}
	t.Fatalf("no pid in %s", file)
	return 0
}

// TestExitCodeFileMetEmpty: a read that meets the exit code file created
// but empty (the moment of `>>`) is the daemon's 500; once the code is
// written the record carries it.
func TestExitCodeFileMetEmpty(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	tb := newSession(t, s, id, "race")
	cid := execAsync(t, s, tb, "race", "sleep 0.5")
	s.mu.Lock()
	dir := s.sandboxes[id].sessions["race"].cmds[cid].dir
	s.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, "exit_code"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, b := req(t, s, "GET", tb+"/process/session/race/command/"+cid, "")
	want := `"message":"failed to convert exit code to int: strconv.Atoi: parsing \"\": invalid syntax"`
	if code != 500 || !strings.Contains(string(b), want) {
		t.Fatalf("read of an empty exit code file: %d %s, want 500 with %s", code, b, want)
	}
	if got := waitCode(t, s, tb, "race", cid); got != 0 {
		t.Fatalf("exit code %d, want 0", got)
	}
}

// TestUploadModes: parent directories are created 0750, the file with
// os.Create's 0666 (both less the umask).
func TestUploadModes(t *testing.T) {
	s := New(t, Options{})
	id := startedSandbox(t, s)
	home, _ := s.Home(id)
	var body bytes.Buffer
	body.WriteString("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nx\r\n--b--\r\n")
	r, _ := http.NewRequest("POST", s.ToolboxProxyURL()+"/"+id+"/files/upload?path=a/b/f", &body)
	r.Header.Set("Authorization", "Bearer "+s.APIKey)
	r.Header.Set("Content-Type", "multipart/form-data; boundary=b")
	resp, err := http.DefaultClient.Do(r)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("upload: %v %v", resp, err)
	}
	resp.Body.Close()
	mask := syscall.Umask(0)
	syscall.Umask(mask)
	for p, want := range map[string]os.FileMode{"a": 0o750, "a/b": 0o750, "a/b/f": 0o666} {
		fi, err := os.Stat(filepath.Join(home, p))
		if want &^= os.FileMode(mask); err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v, %v; want %v", p, fi.Mode().Perm(), err, want)
		}
	}
}

// TestInputBlocksWithoutDeadline: input to a command that does not read
// yet waits, with no deadline, until it reads (here 11 s, past the 10 s
// deadline the stand-in once had), and then all of it arrives.
func TestInputBlocksWithoutDeadline(t *testing.T) {
	t.Parallel()
	s := New(t, Options{})
	id := startedSandbox(t, s)
	home, _ := s.Home(id)
	tb := newSession(t, s, id, "in")
	cid := execAsync(t, s, tb, "in", "sleep 11; head -c 200000 > got")
	data := strings.Repeat("x", 199999)
	body, _ := json.Marshal(map[string]string{"data": data})
	time.Sleep(300 * time.Millisecond) // the command holds its stdin open
	start := time.Now()
	code, b := req(t, s, "POST", tb+"/process/session/in/command/"+cid+"/input", string(body))
	if code != 204 {
		t.Fatalf("input: %d %s", code, b)
	}
	if d := time.Since(start); d < 10*time.Second {
		t.Fatalf("input answered after %v: it did not wait for the reader", d)
	}
	waitCode(t, s, tb, "in", cid)
	if got, err := os.ReadFile(filepath.Join(home, "got")); err != nil || string(got) != data+"\n" {
		t.Fatalf("the command read %d bytes, %v; want %d", len(got), err, len(data)+1)
	}
}
