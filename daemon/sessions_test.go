package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestExecExitTruth(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	res := a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Errorf("stdout %q stderr %q, want %q %q", res.Stdout, res.Stderr, "out\n", "err\n")
	}
	if res.Exit.Reason != "exited" || res.Exit.Code != 3 {
		t.Errorf("exit %+v, want exited 3", res.Exit)
	}
	if res.Exit.Lengths["stdout"] != 4 || res.Exit.Lengths["stderr"] != 4 {
		t.Errorf("lengths %v, want 4 and 4", res.Exit.Lengths)
	}
	// The exec is a real, listed, journaled session.
	var s wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/"+res.Session, nil, 200, &s)
	if s.State != "exited" || s.Exit == nil || s.Exit.Code != 3 {
		t.Errorf("session %+v", s)
	}
	// The same on the streaming path.
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "exit 3"}})
	at := a.attach(ctxFor(t, 30*time.Second), "box", sess.ID, "", nil)
	if at.terminal == nil || at.terminal.Kind != wire.FrameExit || at.exit.Code != 3 || at.exit.Reason != "exited" {
		t.Fatalf("attach terminal %+v exit %+v (close %v)", at.terminal, at.exit, at.closeErr)
	}
}

func TestExecStdinCwdEnvAndWorkspace(t *testing.T) {
	a := startDaemon(t)
	sb := a.createSandbox("box")
	if err := os.Mkdir(filepath.Join(sb.WorkspaceOnHost(), "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	res := a.exec("box", wire.Exec{Argv: []string{"cat"}, Stdin: []byte("hello\x00world")})
	if string(res.Stdout) != "hello\x00world" || res.Exit.Code != 0 {
		t.Errorf("cat: %q %+v", res.Stdout, res.Exit)
	}
	// No stdin: the command reads EOF at once (it starts with stdin closed).
	res = a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "cat; echo eof"}, TimeoutMS: 20000})
	if string(res.Stdout) != "eof\n" || res.Exit.Code != 0 || res.TimedOut {
		t.Errorf("exec without stdin: %q %+v timed out %v", res.Stdout, res.Exit, res.TimedOut)
	}
	res = a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "pwd; echo $FOO; echo $RUNNERD_TOKEN"}, Cwd: "sub", Env: []string{"FOO=bar"}})
	want := filepath.Join(sb.Workspace, "sub") + "\nbar\n\n"
	if string(res.Stdout) != want {
		t.Errorf("got %q, want %q", res.Stdout, want)
	}
	res = a.exec("box", wire.Exec{Argv: []string{"pwd"}})
	if string(res.Stdout) != sb.Workspace+"\n" {
		t.Errorf("default cwd %q, want %q", res.Stdout, sb.Workspace)
	}
	a.wantError(a.do("POST", "/v1/sandboxes/box/exec", wire.Exec{Argv: []string{"/no/such/binary"}}), 400, wire.CodeInvalid)
}

func TestExecTimeoutTerminates(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	start := time.Now()
	res := a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "echo started; exec sleep 30"}, TimeoutMS: 300})
	if !res.TimedOut || res.Exit.Reason != "signaled" || res.Exit.Signal != 15 {
		t.Errorf("got timed_out=%v exit %+v, want a SIGTERM", res.TimedOut, res.Exit)
	}
	if string(res.Stdout) != "started\n" {
		t.Errorf("stdout %q", res.Stdout)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestExecOutputBounded(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	// 16 MiB + 1 byte on stdout.
	res := a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "head -c 16777217 /dev/zero"}})
	if len(res.Stdout) != wire.MaxExecOutput || !res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("got %d bytes truncated=%v", len(res.Stdout), res.StdoutTruncated)
	}
	if res.Exit.Lengths["stdout"] != wire.MaxExecOutput+1 {
		t.Errorf("journaled %d", res.Exit.Lengths["stdout"])
	}
}

func TestAttachReplayFromCursor(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	script := `for i in $(seq 1 200); do echo "out line $i"; echo "err line $i" >&2; done; exit 5`
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", script}})
	full := a.attach(ctxFor(t, 30*time.Second), "box", sess.ID, "", nil)
	if full.terminal == nil || full.exit.Code != 5 {
		t.Fatalf("terminal %+v exit %+v", full.terminal, full.exit)
	}
	var wantOut, wantErr bytes.Buffer
	for i := 1; i <= 200; i++ {
		fmt.Fprintf(&wantOut, "out line %d\n", i)
		fmt.Fprintf(&wantErr, "err line %d\n", i)
	}
	if !bytes.Equal(full.streams["stdout"], wantOut.Bytes()) || !bytes.Equal(full.streams["stderr"], wantErr.Bytes()) {
		t.Fatalf("full read differs: %d/%d bytes", len(full.streams["stdout"]), len(full.streams["stderr"]))
	}
	for _, c := range [][2]int{{0, 0}, {1, 7}, {1000, 10}, {wantOut.Len(), wantErr.Len()}, {wantOut.Len() - 1, 0}} {
		part := a.attach(ctxFor(t, 30*time.Second), "box", sess.ID, fmt.Sprintf("stdout=%d&stderr=%d", c[0], c[1]), nil)
		gotOut := append(append([]byte{}, wantOut.Bytes()[:c[0]]...), part.streams["stdout"]...)
		gotErr := append(append([]byte{}, wantErr.Bytes()[:c[1]]...), part.streams["stderr"]...)
		if !bytes.Equal(gotOut, wantOut.Bytes()) || !bytes.Equal(gotErr, wantErr.Bytes()) {
			t.Errorf("cursor %v: concatenation differs", c)
		}
		if part.terminal == nil || part.terminal.Kind != wire.FrameExit || part.exit.Code != 5 {
			t.Errorf("cursor %v: terminal %+v", c, part.terminal)
		}
		if part.exit.Lengths["stdout"] != int64(wantOut.Len()) {
			t.Errorf("cursor %v: lengths %v", c, part.exit.Lengths)
		}
	}
	// Cursors outside the stream are refused before the upgrade.
	for _, q := range []string{"stdout=99999", "stdout=-1", "stdout=x", "stderr=1e3"} {
		r := a.do("GET", "/v1/sandboxes/box/sessions/"+sess.ID+"/attach?"+q, nil)
		a.wantError(r, 400, wire.CodeInvalid)
	}
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/nope/attach", nil), 404, wire.CodeNotFound)
}

func TestLiveAttachAndStdinTotal(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{ID: "cat-1", Argv: []string{"cat"}})
	if sess.State != "running" || sess.PID == 0 || sess.ID != "cat-1" {
		t.Fatalf("session %+v", sess)
	}
	ctx := ctxFor(t, 30*time.Second)
	done := make(chan attachResult, 1)
	go func() {
		b := *a
		b.t = t
		done <- b.attach(ctx, "box", "cat-1", "", nil)
	}()
	for _, msg := range []string{"one\n", "two\n", "three\n"} {
		a.must("POST", "/v1/sandboxes/box/sessions/cat-1/stdin", msg, 204, nil)
	}
	// cat ends on the close and on nothing else.
	time.Sleep(200 * time.Millisecond)
	var s wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/cat-1", nil, 200, &s)
	if s.State != "running" {
		t.Fatalf("cat ended before close-stdin: %+v", s)
	}
	a.must("POST", "/v1/sandboxes/box/sessions/cat-1/close-stdin", nil, 204, nil)
	res := <-done
	if got := string(res.streams["stdout"]); got != "one\ntwo\nthree\n" {
		t.Errorf("stdout %q", got)
	}
	if res.terminal == nil || res.exit.Reason != "exited" || res.exit.Code != 0 {
		t.Errorf("terminal %+v", res.exit)
	}
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/cat-1/stdin", "late"), 409, wire.CodeCommandExited)
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/cat-1/close-stdin", nil), 409, wire.CodeCommandExited)
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/cat-1/signal", `{"signal":"TERM"}`), 409, wire.CodeCommandExited)
	// The session is checked before the body is read (TestStdinLooksUpSessionFirst).
	big := bytes.Repeat([]byte("x"), 8<<20+1)
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/cat-1/stdin", big), 409, wire.CodeCommandExited)
}

func TestSpawnRetryByID(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	req := wire.CreateSession{ID: "turn-1", Argv: []string{"sleep", "30"}}
	first := a.spawn("box", req)
	var again wire.Session
	a.must("POST", "/v1/sandboxes/box/sessions", req, 200, &again)
	if again.PID != first.PID || again.ID != first.ID {
		t.Errorf("retry started another process: %+v vs %+v", again, first)
	}
	req.Argv = []string{"sleep", "31"}
	r := a.do("POST", "/v1/sandboxes/box/sessions", req)
	a.wantError(r, 409, wire.CodeInvalid)
	if !strings.HasPrefix(r.errBody(t).Detail, wire.DetailConflict) {
		t.Errorf("detail %q", r.errBody(t).Detail)
	}
	var list wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &list)
	if len(list.Sessions) != 1 {
		t.Errorf("sessions %+v", list.Sessions)
	}
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/nope", nil), 404, wire.CodeNotFound)
	a.wantError(a.do("GET", "/v1/sandboxes/nobox/sessions/turn-1", nil), 404, wire.CodeNotFound)
}

func TestTerminateAndSignal(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/terminate", `{"grace_ms":30001}`), 400, wire.CodeInvalid)
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/signal", `{"signal":"NOPE"}`), 400, wire.CodeInvalid)
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/resize", `{"rows":10,"cols":10}`), 400, wire.CodeInvalid)
	var exit wire.Exit
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/terminate", `{"grace_ms":500}`, 200, &exit)
	if exit.Reason != "signaled" || exit.Signal != 15 || exit.Code != 128+15 {
		t.Errorf("terminate: %+v", exit)
	}
	var again wire.Exit
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/terminate", `{"grace_ms":500}`, 200, &again)
	if again.Reason != exit.Reason || again.Signal != exit.Signal {
		t.Errorf("second terminate %+v", again)
	}
	// SIGTERM ignored: SIGKILL after the grace.
	sess = a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "trap '' TERM; echo ready; sleep 60"}})
	a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", func(wire.Frame) bool { return true })
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/terminate", `{"grace_ms":300}`, 200, &exit)
	if exit.Reason != "signaled" || exit.Signal != 9 {
		t.Errorf("terminate of a TERM-ignoring command: %+v", exit)
	}
	sess = a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/signal", `{"signal":"SIGINT"}`, 204, nil)
	at := a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", nil)
	if at.exit.Reason != "signaled" || at.exit.Signal != 2 {
		t.Errorf("after SIGINT: %+v", at.exit)
	}
}

func TestTTYSession(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "stty size; read x; stty size"}, TTY: true, Rows: 30, Cols: 100})
	if !sess.TTY || len(sess.Streams) != 1 {
		t.Fatalf("session %+v", sess)
	}
	a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", func(f wire.Frame) bool { return bytes.Contains(f.Payload, []byte("30 100")) })
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/resize", `{"rows":40,"cols":120}`, 204, nil)
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/stdin", "go\n", 204, nil)
	at := a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", nil)
	out := string(at.streams["stdout"])
	if !strings.Contains(out, "30 100") || !strings.Contains(out, "40 120") || at.exit.Code != 0 {
		t.Errorf("tty output %q exit %+v", out, at.exit)
	}
	if _, ok := at.streams["stderr"]; ok {
		t.Error("a tty session sent stderr")
	}
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/"+sess.ID+"/streams/stderr", nil), 400, wire.CodeInvalid)
}

func TestStreamEndpoint(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	// The session waits for stdin, so it is running when the request
	// arrives and the body is the running form: chunked, with trailers
	// (streams_test.go has the ended form).
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "printf 0123456789; read _; printf abc; exit 4"}})
	// Cursor 3 must exist when the request arrives (a cursor beyond the
	// end is invalid): the spawn answers once the command runs, not once
	// it has printed.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var s wire.Session
		a.must("GET", "/v1/sandboxes/box/sessions/"+sess.ID, nil, 200, &s)
		if s.Lengths["stdout"] >= 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stdout length %d, want 10", s.Lengths["stdout"])
		}
	}
	req, _ := http.NewRequest("GET", a.base+"/v1/sandboxes/box/sessions/"+sess.ID+"/streams/stdout?cursor=3&follow=1", nil)
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/stdin", "go\n", 204, nil)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != "3456789abc" {
		t.Fatalf("body %q err %v", body, err)
	}
	if end := resp.Trailer.Get(wire.HeaderStreamEnd); end != "exit" {
		t.Errorf("stream end %q", end)
	}
	var exit wire.Exit
	if err := jsonUnmarshal([]byte(resp.Trailer.Get(wire.HeaderExit)), &exit); err != nil || exit.Code != 4 {
		t.Errorf("exit trailer %q: %v", resp.Trailer.Get(wire.HeaderExit), err)
	}
	// Without follow on a running session: what is there, then "more".
	sess = a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "printf hi; exec sleep 30"}})
	a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", func(wire.Frame) bool { return true })
	req, _ = http.NewRequest("GET", a.base+"/v1/sandboxes/box/sessions/"+sess.ID+"/streams/stdout", nil)
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err = a.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hi" || resp.Trailer.Get(wire.HeaderStreamEnd) != "more" {
		t.Errorf("got %q end %q", body, resp.Trailer.Get(wire.HeaderStreamEnd))
	}
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/"+sess.ID+"/streams/stdout?cursor=3", nil), 400, wire.CodeInvalid)
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/"+sess.ID+"/streams/stdlog", nil), 400, wire.CodeInvalid)
}

func TestSuspendResumeKeepsWorkspace(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	res := a.exec("box", wire.Exec{Argv: []string{"sh", "-c", "echo memory > notes.txt"}})
	if res.Exit.Code != 0 {
		t.Fatalf("exec %+v", res.Exit)
	}
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	var sb wire.Sandbox
	a.must("POST", "/v1/sandboxes/box/suspend", nil, 200, &sb)
	if sb.State != "suspended" || sb.ParkedAt == nil {
		t.Errorf("suspend: %+v", sb)
	}
	var s wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/"+sess.ID, nil, 200, &s)
	if s.State != "exited" || s.Exit == nil || s.Exit.Reason != "signaled" {
		t.Errorf("session after suspend: %+v", s)
	}
	at := a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", nil)
	if at.terminal == nil || at.exit.Reason != "signaled" {
		t.Errorf("attach after suspend: %+v", at.exit)
	}
	a.must("POST", "/v1/sandboxes/box/suspend", nil, 200, &sb) // idempotent
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions", wire.CreateSession{Argv: []string{"true"}}), 409, wire.CodeInvalid)
	a.wantError(a.do("POST", "/v1/sandboxes/box/exec", wire.Exec{Argv: []string{"true"}}), 409, wire.CodeInvalid)
	var resumed wire.Sandbox
	a.must("POST", "/v1/sandboxes/box/resume", nil, 200, &resumed)
	if resumed.State != "running" || resumed.ParkedAt != nil || resumed.Incarnation != sb.Incarnation {
		t.Errorf("resume: %+v", resumed)
	}
	res = a.exec("box", wire.Exec{Argv: []string{"cat", "notes.txt"}})
	if string(res.Stdout) != "memory\n" {
		t.Errorf("after resume: %q", res.Stdout)
	}
	a.wantError(a.do("POST", "/v1/sandboxes/absent/suspend", nil), 404, wire.CodeNotFound)
	a.wantError(a.do("POST", "/v1/sandboxes/absent/resume", nil), 404, wire.CodeNotFound)
}

func TestDestroyStopsSessions(t *testing.T) {
	a := startDaemon(t)
	sb := a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	a.must("DELETE", "/v1/sandboxes/box", nil, 204, nil)
	if err := processGone(sess.PID, 5*time.Second); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(sb.WorkspaceOnHost()); !os.IsNotExist(err) {
		t.Errorf("workspace remains: %v", err)
	}
	if dirs := sessionDirs(t, a); len(dirs) != 0 {
		t.Errorf("session dirs remain: %q", dirs)
	}
	a.wantError(a.do("GET", "/v1/sandboxes/box/sessions/"+sess.ID, nil), 404, wire.CodeNotFound)
}

func TestSlowClientBlocksNobody(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{Argv: []string{"sh", "-c", "cat; head -c 20000000 /dev/zero; exit 6"}})
	// A client that attaches and never reads.
	ctx := ctxFor(t, 60*time.Second)
	conn := dialAttach(t, ctx, a, "box", sess.ID)
	defer conn.CloseNow()
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/close-stdin", nil, 204, nil)
	// The command finishes and another client reads everything.
	at := a.attach(ctx, "box", sess.ID, "", nil)
	if at.exit.Code != 6 || len(at.streams["stdout"]) != 20000000 {
		t.Errorf("got %d bytes, exit %+v", len(at.streams["stdout"]), at.exit)
	}
}

func TestMetrics(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	a.exec("box", wire.Exec{Argv: []string{"printf", "12345"}})
	a.spawn("box", wire.CreateSession{Argv: []string{"sleep", "60"}})
	a.do("GET", "/v1/sandboxes/nope", nil)
	r := a.do("GET", "/metrics", nil)
	for _, want := range []string{
		"runnerd_sandboxes 1\n",
		"runnerd_sessions_running 1\n",
		"runnerd_journal_bytes 5\n",
		"runnerd_sessions_started_total 2\n",
		`runnerd_errors_total{code="not_found"} 1` + "\n",
		"runnerd_attaches 0\n",
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %q:\n%s", want, r.body)
		}
	}
}

// TestSpawnRetryRunsOnce: a spawn of an id that exists hands the warm shim
// it prepared back (cancelled: its command never runs, its directory is
// removed), whether the request is the same (the existing session is the
// answer) or not (409).
func TestSpawnRetryRunsOnce(t *testing.T) {
	a := startDaemon(t)
	sb := a.createSandbox("box")
	req := wire.CreateSession{ID: "once", Argv: []string{"sh", "-c", "echo ran >> runs; exec sleep 30"}}
	first := a.spawn("box", req)
	var again wire.Session
	a.must("POST", "/v1/sandboxes/box/sessions", req, 200, &again)
	if again.PID != first.PID {
		t.Errorf("retry: pid %d, want the first spawn's %d", again.PID, first.PID)
	}
	other := req
	other.Argv = []string{"sh", "-c", "echo other >> runs"}
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions", other), 409, wire.CodeInvalid)
	time.Sleep(200 * time.Millisecond) // a command started by mistake would have written by now
	if b, err := os.ReadFile(filepath.Join(sb.WorkspaceOnHost(), "runs")); err != nil || string(b) != "ran\n" {
		t.Errorf("runs: got %q %v, want one run", b, err)
	}
	if dirs := sessionDirs(t, a); len(dirs) != 1 {
		t.Errorf("session directories: got %q, want the one session's", dirs)
	}
}
