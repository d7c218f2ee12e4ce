package daytona_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona"
	"github.com/agentrunner/runner/adapter/daytona/daytonatest"
)

// shellName is the shell the stand-ins of box run: the one their shells
// file lists (as a Daytona image's /etc/shells does).
const shellName = "/bin/bash"

// box is a started sandbox of a fresh stand-in and its toolbox.
func box(t *testing.T) (*daytonatest.Server, daytona.Sandbox, *daytona.Toolbox) {
	t.Helper()
	shells := filepath.Join(t.TempDir(), "shells")
	if err := os.WriteFile(shells, []byte("# /etc/shells\n/bin/sh\n"+shellName+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := daytonatest.New(t, daytonatest.Options{ShellsFile: shells})
	c := newClient(t, srv)
	sb := started(t, c, "box-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	tb, err := c.Toolbox(testCtx(t), sb)
	if err != nil {
		t.Fatalf("Toolbox: %v", err)
	}
	return srv, sb, tb
}

// runAsync runs script in a fresh session and returns the session id and
// the command id.
func runAsync(t *testing.T, tb *daytona.Toolbox, script string) (string, string) {
	t.Helper()
	ctx := testCtx(t)
	sid := "s" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := tb.CreateSession(ctx, sid); err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	r, err := tb.Exec(ctx, sid, script, true)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if r.ExitCode != nil || r.Output != nil {
		t.Fatalf("async Exec answered output or an exit code: %+v", r)
	}
	return sid, r.CmdID
}

// waitExit polls the command record until it carries an exit code.
func waitExit(t *testing.T, tb *daytona.Toolbox, sid, cid string) int {
	t.Helper()
	ctx := testCtx(t)
	for {
		c, err := tb.Command(ctx, sid, cid)
		if err != nil {
			t.Fatalf("Command: %v", err)
		}
		if c.ExitCode != nil {
			return *c.ExitCode
		}
		select {
		case <-ctx.Done():
			t.Fatalf("command %s never exited", cid)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// logsOf runs script to its end in a session and returns its log, split
// or combined.
func logsOf(t *testing.T, tb *daytona.Toolbox, script string, split bool) (string, int) {
	t.Helper()
	sid, cid := runAsync(t, tb, script)
	code := waitExit(t, tb, sid, cid)
	b, err := tb.Logs(testCtx(t), sid, cid, split)
	if err != nil {
		t.Fatalf("Logs: %v", err)
	}
	return string(b), code
}

func TestExecuteMergesOutput(t *testing.T) {
	_, _, tb := box(t)
	ctx := testCtx(t)
	cases := []struct {
		name string
		req  daytona.ExecuteRequest
		code int
		out  string
	}{
		{"merged streams", daytona.ExecuteRequest{Command: `sh -c "echo out; echo err >&2; exit 3"`}, 3, "out\nerr\n"},
		{"through a shell: quotes, nothing expanded in single ones", daytona.ExecuteRequest{Command: `echo '$HOME' "a b"`}, 0, "$HOME a b\n"},
		{"through a shell: a script", daytona.ExecuteRequest{Command: "x=4\necho $((x+1)) | tr 5 6"}, 0, "6\n"},
		{"envs", daytona.ExecuteRequest{Command: `sh -c 'echo $FOO'`, Envs: map[string]string{"FOO": "bar"}}, 0, "bar\n"},
		{"invalid UTF-8 replaced, NUL kept", daytona.ExecuteRequest{Command: `printf '\377\000ok'`}, 0, "\uFFFD\x00ok"},
		{"missing program is the shell's 127", daytona.ExecuteRequest{Command: "no-such-program-xyz"}, 127, shellName + ": line 1: no-such-program-xyz: command not found\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tb.Execute(ctx, tc.req)
			if err != nil {
				t.Fatalf("Execute: %v", err)
			}
			if r.ExitCode != tc.code || r.Result != tc.out {
				t.Fatalf("got exit %d output %q, want %d %q", r.ExitCode, r.Result, tc.code, tc.out)
			}
		})
	}
	if err := tb.Upload(ctx, "sub/f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	r, err := tb.Execute(ctx, daytona.ExecuteRequest{Command: "pwd", Cwd: "sub"})
	if err != nil || !strings.HasSuffix(r.Result, "/home/sub\n") {
		t.Fatalf("Execute in cwd: got %+v, %v", r, err)
	}
	start := time.Now()
	_, err = tb.Execute(ctx, daytona.ExecuteRequest{Command: "sleep 30", Timeout: 1})
	wantKind(t, err, adapter.KindUnavailable)
	if time.Since(start) > 10*time.Second {
		t.Fatalf("the timeout did not end the command")
	}
}

func TestSessionCommandExitCodeAndLogs(t *testing.T) {
	_, _, tb := box(t)
	out, code := logsOf(t, tb, "echo hi; echo there; (exit 4)", false)
	if code != 4 || out != "hi\nthere\n" {
		t.Fatalf("got exit %d log %q, want 4 %q", code, out, "hi\nthere\n")
	}
}

// TestQuirkCommandsRunInTheSessionShell: a command is sourced in the
// session's own shell: its cd and variables are there for the next
// command, and its exit ends the session: that command never gets an
// exit code, and the next exec is the daemon's 500 "broken pipe" (kind
// invalid: a bad request wrapped by the handler).
func TestQuirkCommandsRunInTheSessionShell(t *testing.T) {
	_, _, tb := box(t)
	ctx := testCtx(t)
	if err := tb.Upload(ctx, "sub/f", []byte("x")); err != nil {
		t.Fatal(err)
	}
	sid, cid := runAsync(t, tb, "cd sub; X=7")
	waitExit(t, tb, sid, cid)
	r, err := tb.Exec(ctx, sid, "pwd; echo $X", false)
	if err != nil || r.Output == nil || !strings.HasSuffix(*r.Output, "/home/sub\n7\n") {
		t.Fatalf("the next command: got %+v, %v; want it in sub with X=7", r, err)
	}
	r, err = tb.Exec(ctx, sid, "echo $0", false)
	if err != nil || r.Output == nil || *r.Output != shellName+"\n" {
		t.Fatalf("the session's shell: got %+v, %v; want %s", r, err, shellName)
	}
	_, cid = runAsync2(t, tb, sid, "echo before; exit 4")
	time.Sleep(500 * time.Millisecond)
	c, err := tb.Command(ctx, sid, cid)
	if err != nil || c.ExitCode != nil {
		t.Fatalf("the command that exited its session: got %+v, %v; want no exit code ever", c, err)
	}
	if b, err := tb.Logs(ctx, sid, cid, false); err != nil || string(b) != "before\n" {
		t.Fatalf("its log: got %q, %v", b, err)
	}
	_, err = tb.Exec(ctx, sid, "echo after", true)
	var e *daytona.Error
	if !errors.As(err, &e) || e.Status != 500 || !strings.Contains(e.Message, "failed to write command") || !strings.Contains(e.Message, "broken pipe") {
		t.Fatalf("exec after the session's exit: got %v, want the daemon's 500 broken pipe", err)
	}
	wantKind(t, err, adapter.KindInvalid)
}

// runAsync2 runs script in the existing session sid.
func runAsync2(t *testing.T, tb *daytona.Toolbox, sid, script string) (string, string) {
	t.Helper()
	r, err := tb.Exec(testCtx(t), sid, script, true)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return sid, r.CmdID
}

// The quirks of session output, exactly as a client sees them.

func TestQuirkNULBytesDropped(t *testing.T) {
	_, _, tb := box(t)
	if out, _ := logsOf(t, tb, `printf 'a\000b\n'`, false); out != "ab\n" {
		t.Fatalf("got %q, want %q", out, "ab\n")
	}
}

func TestQuirkFinalNewlineAdded(t *testing.T) {
	_, _, tb := box(t)
	if out, _ := logsOf(t, tb, `printf 'abc'`, false); out != "abc\n" {
		t.Fatalf("got %q, want %q", out, "abc\n")
	}
}

// TestQuirkInvalidUTF8KeptInPlainLogs: the plain-text log keeps invalid
// UTF-8 as raw bytes, split or not; only a JSON answer (a synchronous
// exec's output) carries U+FFFD.
func TestQuirkInvalidUTF8KeptInPlainLogs(t *testing.T) {
	_, _, tb := box(t)
	if out, _ := logsOf(t, tb, `printf '\377x\n'`, false); out != "\xffx\n" {
		t.Fatalf("combined: got %q, want %q", out, "\xffx\n")
	}
	if out, _ := logsOf(t, tb, `printf '\377x\n'`, true); out != "\x01\x01\x01\xffx\n" {
		t.Fatalf("split: got %q", out)
	}
	sid, _ := runAsync(t, tb, "true")
	r, err := tb.Exec(testCtx(t), sid, `printf '\377y\n'`, false)
	if err != nil || r.Output == nil || *r.Output != "\uFFFDy\n" {
		t.Fatalf("sync exec output: got %+v, %v; want U+FFFD", r, err)
	}
}

func TestQuirkStreamMarkers(t *testing.T) {
	_, _, tb := box(t)
	if out, _ := logsOf(t, tb, `printf 'a\nb'`, true); out != "\x01\x01\x01a\n\x01\x01\x01b\n" {
		t.Fatalf("stdout split: got %q", out)
	}
	if out, _ := logsOf(t, tb, `echo e >&2`, true); out != "\x02\x02\x02e\n" {
		t.Fatalf("stderr split: got %q", out)
	}
	// A marker inside a payload: combined output loses the payload bytes,
	// split output cannot tell it from a marker.
	if out, _ := logsOf(t, tb, `printf 'p\001\001\001q\n'`, false); out != "pq\n" {
		t.Fatalf("payload marker combined: got %q, want %q", out, "pq\n")
	}
	if out, _ := logsOf(t, tb, `printf 'p\002\002\002q\n'`, true); out != "\x01\x01\x01p\x02\x02\x02q\n" {
		t.Fatalf("payload marker split: got %q", out)
	}
}

func TestQuirkInputNewlineAndEcho(t *testing.T) {
	srv, sb, tb := box(t)
	ctx := testCtx(t)
	sid, cid := runAsync(t, tb, "head -c 4 > in.bin; echo done")
	// Input is accepted once the command holds its stdin open; the first
	// call may race the wrapper creating the FIFO (a daemon 500).
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := tb.SendInput(ctx, sid, cid, "x")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SendInput: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tb.SendInput(ctx, sid, cid, "y\n"); err != nil {
		t.Fatalf("SendInput: %v", err)
	}
	if code := waitExit(t, tb, sid, cid); code != 0 {
		t.Fatalf("exit %d", code)
	}
	home, _ := srv.Home(sb.ID)
	got, err := os.ReadFile(filepath.Join(home, "in.bin"))
	if err != nil || string(got) != "x\ny\n" {
		t.Fatalf("stdin bytes: got %q, %v; want %q (newline appended to x, not doubled after y)", got, err, "x\ny\n")
	}
	split, err := tb.Logs(ctx, sid, cid, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\x01\x01\x01x\n", "\x01\x01\x01y\n", "\x01\x01\x01done\n"} {
		if !strings.Contains(string(split), want) {
			t.Fatalf("log %q lacks the echoed input line %q", split, want)
		}
	}
	// Input is a JSON string: bytes that are not UTF-8 are refused here,
	// before any request.
	err = tb.SendInput(ctx, sid, cid, "\xff")
	wantKind(t, err, adapter.KindInvalid)
	// After the exit: command_exited.
	err = tb.SendInput(ctx, sid, cid, "late")
	if !errors.Is(err, adapter.ErrCommandExited) {
		t.Fatalf("SendInput after exit: got %v, want ErrCommandExited", err)
	}
}

func TestQuirkNoStdinEOFAndNoKill(t *testing.T) {
	srv, sb, tb := box(t)
	ctx := testCtx(t)
	sid, cid := runAsync(t, tb, `sh -c 'echo $$ > cat.pid; exec cat > cat.out'`)
	home, _ := srv.Home(sb.ID)
	var pid int
	for deadline := time.Now().Add(5 * time.Second); pid == 0; {
		b, _ := os.ReadFile(filepath.Join(home, "cat.pid"))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		if pid == 0 && time.Now().After(deadline) {
			t.Fatalf("the command never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	// Nothing closes cat's stdin: it still runs.
	c, err := tb.Command(ctx, sid, cid)
	if err != nil || c.ExitCode != nil {
		t.Fatalf("Command: got %+v, %v; want still running", c, err)
	}
	// Deleting the session is the only way to end it.
	if err := tb.DeleteSession(ctx, sid); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("cat %d survived its session", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = tb.Command(ctx, sid, cid)
	if !daytona.IsToolboxNotFound(err) || errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Command of a deleted session: got %v, want the daemon's 404, not ErrNotFound", err)
	}
	wantKind(t, err, adapter.KindProvider)
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && syscall.Kill(pid, 0) == nil
}

func TestQuirkSessionRunsOneCommandAtATime(t *testing.T) {
	_, _, tb := box(t)
	ctx := testCtx(t)
	sid, first := runAsync(t, tb, "sleep 0.6")
	second, err := tb.Exec(ctx, sid, "echo second", true)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if c, err := tb.Command(ctx, sid, second.CmdID); err != nil || c.ExitCode != nil {
		t.Fatalf("second command: got %+v, %v; want waiting behind the first", c, err)
	}
	waitExit(t, tb, sid, first)
	waitExit(t, tb, sid, second.CmdID)
	if b, err := tb.Logs(ctx, sid, second.CmdID, false); err != nil || string(b) != "second\n" {
		t.Fatalf("Logs: got %q, %v", b, err)
	}
}

func TestToolboxErrors(t *testing.T) {
	_, _, tb := box(t)
	ctx := testCtx(t)
	if err := tb.CreateSession(ctx, "dup"); err != nil {
		t.Fatal(err)
	}
	err := tb.CreateSession(ctx, "dup")
	if !daytona.IsSessionExists(err) {
		t.Fatalf("CreateSession twice: got %v, want IsSessionExists", err)
	}
	wantKind(t, err, adapter.KindInvalid)
	_, err = tb.Exec(ctx, "nope", "true", true)
	if !daytona.IsToolboxNotFound(err) || errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Exec in an unknown session: got %v", err)
	}
	_, err = tb.Command(ctx, "dup", "nope")
	if !daytona.IsToolboxNotFound(err) {
		t.Fatalf("Command unknown: got %v", err)
	}
	wantKind(t, err, adapter.KindProvider)
	_, err = tb.Exec(ctx, "dup", "  ", true)
	wantKind(t, err, adapter.KindInvalid)
	_, err = tb.Download(ctx, "missing.txt")
	if !daytona.IsToolboxNotFound(err) || errors.Is(err, adapter.ErrNotFound) {
		t.Fatalf("Download missing: got %v", err)
	}
	wantKind(t, err, adapter.KindInvalid)
	err = tb.Upload(ctx, "", []byte("x"))
	wantKind(t, err, adapter.KindInvalid)
	err = tb.Upload(ctx, "/outside/the/sandbox", []byte("x"))
	wantKind(t, err, adapter.KindInvalid)
	// A session id with a dot is accepted.
	if err := tb.CreateSession(ctx, "a.b"); err != nil {
		t.Fatalf("CreateSession a.b: %v", err)
	}
	if r, err := tb.Exec(ctx, "a.b", "echo dot", false); err != nil || r.Output == nil || *r.Output != "dot\n" {
		t.Fatalf("Exec in a.b: %+v, %v", r, err)
	}
}

func TestUploadDownloadBytes(t *testing.T) {
	_, _, tb := box(t)
	ctx := testCtx(t)
	data := []byte{0, 1, 2, 0xff, 0xfe, '\n', 1, 1, 1}
	if err := tb.Upload(ctx, "bin/blob", data); err != nil {
		t.Fatalf("Upload: %v", err)
	}
	got, err := tb.Download(ctx, "bin/blob")
	if err != nil || string(got) != string(data) {
		t.Fatalf("Download: got %q, %v; want %q", got, err, data)
	}
	// An uploaded file is not executable until the caller makes it so.
	r, err := tb.Execute(ctx, daytona.ExecuteRequest{Command: "test -x bin/blob"})
	if err != nil || r.ExitCode != 1 {
		t.Fatalf("test -x: got %+v, %v; want exit 1", r, err)
	}
}

// TestLogsGrowFromByteZero: the log of a running command is readable at
// any time, from byte zero, and only grows: a poller keeps its own offset.
func TestLogsGrowFromByteZero(t *testing.T) {
	_, _, tb := box(t)
	ctx := testCtx(t)
	sid, cid := runAsync(t, tb, "echo a; sleep 0.7; echo b")
	var mid []byte
	for deadline := time.Now().Add(5 * time.Second); string(mid) != "a\n"; {
		var err error
		if mid, err = tb.Logs(ctx, sid, cid, false); err != nil {
			t.Fatalf("Logs while running: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Logs while running: got %q, want %q", mid, "a\n")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c, err := tb.Command(ctx, sid, cid); err != nil || c.ExitCode != nil {
		t.Fatalf("Command: got %+v, %v; want running", c, err)
	}
	waitExit(t, tb, sid, cid)
	end, err := tb.Logs(ctx, sid, cid, false)
	if err != nil || string(end) != "a\nb\n" {
		t.Fatalf("Logs after exit: got %q, %v", end, err)
	}
}
