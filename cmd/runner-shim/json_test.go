package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/gobuild"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

var (
	shimBuild gobuild.Once
	shimDir   = sync.OnceValues(func() (string, error) { return os.MkdirTemp("", "rsbin") })
)

// shimBin builds runner-shim once per test binary, with a version stamped
// in, so the tests run the real thing.
func shimBin(t *testing.T) string {
	t.Helper()
	dir, err := shimDir()
	if err != nil {
		t.Fatal(err)
	}
	return shimBuild.Build(t, filepath.Join(dir, "runner-shim"), "v9.9.9-test", ".")
}

// cli runs runner-shim on a fresh short root.
type cli struct {
	t    *testing.T
	bin  string
	root string
}

func newCLI(t *testing.T) *cli {
	root, err := os.MkdirTemp("", "rs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return &cli{t: t, bin: shimBin(t), root: root}
}

// run returns stdout, stderr and the exit status.
func (c *cli) run(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	cmd := exec.Command(c.bin, append([]string{"--root", c.root}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode()
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

// answer is every field a --json answer may carry.
type answer struct {
	Version  string            `json:"version"`
	ID       string            `json:"id"`
	Created  *bool             `json:"created"`
	OK       bool              `json:"ok"`
	Written  int               `json:"written"`
	Session  *sessiondir.Info  `json:"session"`
	Sessions []sessiondir.Info `json:"sessions"`
	More     bool              `json:"more"`
	Exit     *wire.Exit        `json:"exit"`
	Error    *wire.Error       `json:"error"`
}

// json runs runner-shim --json and decodes its one answer line.
func (c *cli) json(stdin string, args ...string) (answer, int) {
	c.t.Helper()
	out, _, code := c.run(stdin, append([]string{"--json"}, args...)...)
	if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
		c.t.Fatalf("%v: got %q, want one JSON line", args, out)
	}
	var a answer
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		c.t.Fatalf("%v: decode %q: %v", args, out, err)
	}
	if a.Version != "v9.9.9-test" {
		c.t.Fatalf("%v: version %q, want v9.9.9-test", args, a.Version)
	}
	return a, code
}

// frames decodes a binary frame stream.
func frames(t *testing.T, b []byte) []wire.Frame {
	t.Helper()
	d := wire.NewDecoder(bytes.NewReader(b))
	var fs []wire.Frame
	for {
		f, err := d.Next()
		if errors.Is(err, io.EOF) {
			return fs
		}
		if err != nil {
			t.Fatalf("decode frames: %v", err)
		}
		f.Payload = append([]byte(nil), f.Payload...)
		fs = append(fs, f)
	}
}

func wantCode(t *testing.T, what string, a answer, code int, wantCode wire.Code, wantStatus int) {
	t.Helper()
	if code != wantStatus || a.Error == nil || a.Error.Code != wantCode {
		t.Fatalf("%s: got status %d, answer %+v; want status %d, code %s", what, code, a.Error, wantStatus, wantCode)
	}
}

// TestVersion: both spellings, human and JSON.
func TestVersion(t *testing.T) {
	c := newCLI(t)
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if out, _, code := c.run("", args...); code != 0 || out != "v9.9.9-test\n" {
			t.Errorf("%v: got %q %d, want v9.9.9-test", args, out, code)
		}
	}
	if a, code := c.json("", "version"); code != 0 || a.Error != nil {
		t.Errorf("--json version: %+v %d", a, code)
	}
}

// TestJSONAnswers drives one session through every subcommand with
// --json and checks each answer's shape and the exit statuses.
func TestJSONAnswers(t *testing.T) {
	c := newCLI(t)
	a, code := c.json("", "spawn", "--id", "j1", "--", "sh", "-c", `head -c 5; echo; echo err >&2; sleep 30`)
	if code != 0 || a.ID != "j1" || a.Created == nil || !*a.Created || a.Session == nil ||
		a.Session.State != "running" || strings.Join(a.Session.Argv, " ") != "sh -c head -c 5; echo; echo err >&2; sleep 30" || a.Session.PID == 0 {
		t.Fatalf("spawn: %+v %d", a, code)
	}
	// The same request again answers the same session, not a second one.
	b, code := c.json("", "spawn", "--id", "j1", "--", "sh", "-c", `head -c 5; echo; echo err >&2; sleep 30`)
	if code != 0 || b.Created == nil || *b.Created || b.Session.PID != a.Session.PID {
		t.Fatalf("same spawn again: %+v %d, want created false and pid %d", b, code, a.Session.PID)
	}
	b, code = c.json("", "spawn", "--id", "j1", "--", "sh", "-c", "true")
	wantCode(t, "spawn j1 with another request", b, code, wire.CodeInvalid, wire.ShimExitConflict)
	if !strings.HasPrefix(b.Error.Detail, wire.DetailConflict+":") {
		t.Fatalf("conflict detail %q, want the %q prefix", b.Error.Detail, wire.DetailConflict)
	}
	if a, code := c.json("", "write", "j1", "ab"); code != 0 || !a.OK || a.Written != 2 || a.ID != "j1" {
		t.Fatalf("write: %+v %d", a, code)
	}
	// Binary stdin through base64 lines (a NUL and a newline inside).
	if a, code := c.json(base64.StdEncoding.EncodeToString([]byte("\x00\n"))+"\n"+base64.StdEncoding.EncodeToString([]byte("z"))+"\n", "write", "--base64", "j1"); code != 0 || !a.OK {
		t.Fatalf("write --base64: %+v %d", a, code)
	}
	deadline := time.Now().Add(10 * time.Second)
	var st answer
	for {
		st, code = c.json("", "status", "j1")
		if code != 0 || st.Session == nil {
			t.Fatalf("status: %+v %d", st, code)
		}
		if st.Session.Stdout == 6 && st.Session.Stderr == 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Session.Stdout != 6 || st.Session.Stderr != 4 || st.Session.State != "running" {
		t.Fatalf("status: stdout %d stderr %d state %s, want 6, 4, running", st.Session.Stdout, st.Session.Stderr, st.Session.State)
	}
	if a, code := c.json("", "signal", "j1", "CONT"); code != 0 || !a.OK {
		t.Fatalf("signal CONT: %+v %d", a, code)
	}
	a, code = c.json("", "signal", "j1", "NOPE")
	wantCode(t, "signal NOPE", a, code, wire.CodeInvalid, wire.ShimExitInvalid)
	a, code = c.json("", "resize", "j1", "10", "10")
	wantCode(t, "resize of a pipes session", a, code, wire.CodeInvalid, wire.ShimExitInvalid)
	a, code = c.json("", "terminate", "--grace", "1s", "j1")
	if code != 0 || a.Exit == nil || a.Exit.Reason != wire.ExitSignaled || a.Exit.Signal != int(syscall.SIGTERM) || !a.Exit.Terminated {
		t.Fatalf("terminate: %+v %d", a, code)
	}
	a, code = c.json("", "write", "j1", "late")
	wantCode(t, "write after the exit", a, code, wire.CodeCommandExited, wire.ShimExitCommandExited)
	a, code = c.json("", "close-stdin", "j1")
	wantCode(t, "close-stdin after the exit", a, code, wire.CodeCommandExited, wire.ShimExitCommandExited)
	out, _, code := c.run("", "attach", "j1")
	fs := frames(t, []byte(out))
	var got bytes.Buffer
	for _, f := range fs {
		if f.Kind == wire.FrameData && f.Stream == wire.StreamStdout {
			got.Write(f.Payload)
		}
	}
	if code != 0 || got.String() != "ab\x00\nz\n" || fs[len(fs)-1].Kind != wire.FrameExit {
		t.Fatalf("attach: status %d stdout %q last %v", code, got.String(), fs[len(fs)-1].Kind)
	}
}

// TestExitStatuses: every failure has its own status and code, unknown
// sessions are not_found (attach included: an error frame not_found and
// status 5, never a retryable unavailable), exec failures read as a shell
// says them.
func TestExitStatuses(t *testing.T) {
	c := newCLI(t)
	if a, code := c.json("", "spawn", "--id", "done", "--", "sh", "-c", "printf 12345"); code != 0 || !*a.Created {
		t.Fatalf("spawn: %+v %d", a, code)
	}
	// Wait for its exit.
	for i := 0; ; i++ {
		a, _ := c.json("", "status", "done")
		if a.Session != nil && a.Session.State == "exited" {
			break
		}
		if i > 500 {
			t.Fatal("session did not exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"spawn", "--", "/no/such/program"}, "not_found"},
		{[]string{"spawn", "--", "/etc/hostname"}, "not_executable"},
		{[]string{"write", "nope", "x"}, ""},
	} {
		out, _, _ := c.run("", append([]string{"--json"}, tc.args...)...)
		var e struct {
			Error struct {
				ExecError string `json:"exec_error"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(out), &e); err != nil || e.Error.ExecError != tc.want {
			t.Errorf("%v: exec_error %q (%v), want %q", tc.args, e.Error.ExecError, err, tc.want)
		}
	}
	// errCase is a command that must fail with code, and exit with status.
	type errCase struct {
		name   string
		args   []string
		code   wire.Code
		status int
	}
	for _, tc := range []errCase{
		{"status of an unknown session", []string{"status", "nope"}, wire.CodeNotFound, wire.ShimExitNotFound},
		{"write to an unknown session", []string{"write", "nope", "x"}, wire.CodeNotFound, wire.ShimExitNotFound},
		{"close-stdin of an unknown session", []string{"close-stdin", "nope"}, wire.CodeNotFound, wire.ShimExitNotFound},
		{"terminate of an unknown session", []string{"terminate", "nope"}, wire.CodeNotFound, wire.ShimExitNotFound},
		{"missing program", []string{"spawn", "--", "/no/such/program"}, wire.CodeInvalid, wire.ShimExitExecNotFound},
		{"missing program on PATH", []string{"spawn", "--", "no-such-program-xyz"}, wire.CodeInvalid, wire.ShimExitExecNotFound},
		{"not executable", []string{"spawn", "--", "/etc/hostname"}, wire.CodeInvalid, wire.ShimExitExecNotExecutable},
		{"write after the exit", []string{"write", "done", "x"}, wire.CodeCommandExited, wire.ShimExitCommandExited},
		{"bad id", []string{"spawn", "--id", "../x", "--", "true"}, wire.CodeInvalid, wire.ShimExitInvalid},
		{"usage", []string{"status"}, wire.CodeInvalid, wire.ShimExitUsage},
	} {
		a, code := c.json("", tc.args...)
		wantCode(t, tc.name, a, code, tc.code, tc.status)
	}
	// attach: the terminal frame carries the code, the status agrees.
	for _, tc := range []errCase{
		{"attach to an unknown session", []string{"attach", "nope"}, wire.CodeNotFound, wire.ShimExitNotFound},
		{"attach beyond the end", []string{"attach", "--stdout", "6", "done"}, wire.CodeInvalid, wire.ShimExitInvalid},
	} {
		out, _, status := c.run("", tc.args...)
		fs := frames(t, []byte(out))
		if len(fs) != 1 || fs[0].Kind != wire.FrameError {
			t.Fatalf("%s: frames %v, want one error frame", tc.name, fs)
		}
		we, err := fs[0].Err()
		if err != nil || we.Code != tc.code || status != tc.status {
			t.Fatalf("%s: %v %v status %d, want %s and %d", tc.name, we, err, status, tc.code, tc.status)
		}
	}
	if ents, _ := os.ReadDir(c.root); len(ents) != 1 {
		t.Fatalf("failed spawns left %d entries in the root, want only the one session", len(ents))
	}

	// A shim killed with -9 leaves a lost session: status 4 for a write,
	// a lost frame (status 0, the stream's own answer) for attach.
	a, code := c.json("", "spawn", "--id", "lost", "--", "sleep", "30")
	if code != 0 {
		t.Fatalf("spawn: %+v %d", a, code)
	}
	t.Cleanup(func() { syscall.Kill(a.Session.PID, syscall.SIGKILL) }) // the command this test started
	if err := syscall.Kill(a.Session.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		b, code := c.json("", "write", "lost", "x")
		if b.Error != nil && b.Error.Code == wire.CodeLost {
			if code != wire.ShimExitLost {
				t.Fatalf("write to a lost session: status %d, want %d", code, wire.ShimExitLost)
			}
			break
		}
		if i > 500 {
			t.Fatalf("write to a lost session: %+v %d", b.Error, code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, _, status := c.run("", "attach", "lost")
	if fs := frames(t, []byte(out)); status != 0 || len(fs) != 1 || fs[0].Kind != wire.FrameLost {
		t.Fatalf("attach to a lost session: %v status %d, want one lost frame and 0", fs, status)
	}
}

// TestListOrder: list is in start order (not name order), with argv,
// state and current byte counts, and an empty root lists nothing.
func TestListOrder(t *testing.T) {
	c := newCLI(t)
	if a, code := c.json("", "list"); code != 0 || a.Sessions == nil || len(a.Sessions) != 0 {
		t.Fatalf("empty list: %+v %d", a, code)
	}
	for _, s := range []struct{ id, script string }{{"zz", "printf abc"}, {"aa", "printf 1234567 >&2; sleep 30"}, {"mm", "exit 4"}} {
		if _, code := c.json("", "spawn", "--id", s.id, "--", "sh", "-c", s.script); code != 0 {
			t.Fatalf("spawn %s: %d", s.id, code)
		}
	}
	t.Cleanup(func() { c.run("", "terminate", "--grace", "10ms", "aa") })
	var a answer
	for i := 0; ; i++ {
		a, _ = c.json("", "list")
		if len(a.Sessions) == 3 && a.Sessions[0].State == "exited" && a.Sessions[1].Stderr == 7 && a.Sessions[2].State == "exited" {
			break
		}
		if i > 500 {
			t.Fatalf("list: %+v", a.Sessions)
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := []struct {
		id, state, argv string
		stdout, stderr  int64
	}{
		{"zz", "exited", "sh -c printf abc", 3, 0},
		{"aa", "running", "sh -c printf 1234567 >&2; sleep 30", 0, 7},
		{"mm", "exited", "sh -c exit 4", 0, 0},
	}
	for i, w := range want {
		g := a.Sessions[i]
		if g.ID != w.id || g.State != w.state || strings.Join(g.Argv, " ") != w.argv || g.Stdout != w.stdout || g.Stderr != w.stderr {
			t.Errorf("list[%d] = %s %s %q %d/%d, want %+v", i, g.ID, g.State, g.Argv, g.Stdout, g.Stderr, w)
		}
	}
	if a.Sessions[2].Exit == nil || a.Sessions[2].Exit.Code != 4 {
		t.Errorf("list[2].exit = %+v, want code 4", a.Sessions[2].Exit)
	}
	// Paged: --max-bytes ends a page early (at least one session) with
	// "more"; --after continues in start order; an unknown --after is
	// invalid, never an empty page.
	var paged []string
	after := ""
	for range 4 {
		args := []string{"list", "--max-bytes", "1"}
		if after != "" {
			args = append(args, "--after", after)
		}
		p, code := c.json("", args...)
		if code != 0 || len(p.Sessions) != 1 {
			t.Fatalf("list page after %q: %+v %d, want one session", after, p, code)
		}
		paged = append(paged, p.Sessions[0].ID)
		after = p.Sessions[0].ID
		if !p.More {
			break
		}
	}
	if strings.Join(paged, ",") != "zz,aa,mm" {
		t.Errorf("pages %v, want zz,aa,mm then no more", paged)
	}
	if p, _ := c.json("", "list", "--after", "nope"); p.Error == nil || p.Error.Code != wire.CodeInvalid {
		t.Errorf("list --after an unknown id: %+v, want invalid", p)
	}
	// The human form: one object per line, same order.
	out, _, code := c.run("", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.Contains(lines[0], `"id":"zz"`) || !strings.Contains(lines[1], `"id":"aa"`) {
		t.Errorf("list: %q", out)
	}
}

// TestBase64Attach: --base64 carries exactly the frames of the binary
// attach, one per line, bytes that a text transport would mangle
// included.
func TestBase64Attach(t *testing.T) {
	c := newCLI(t)
	if _, code := c.json("", "spawn", "--id", "b", "--", "sh", "-c", `printf '\000\377\r\n\033[0m'; printf 'e\000' >&2; exit 2`); code != 0 {
		t.Fatal("spawn")
	}
	var bin string
	for i := 0; ; i++ {
		out, _, _ := c.run("", "attach", "b")
		if fs := frames(t, []byte(out)); len(fs) > 0 && fs[len(fs)-1].Kind == wire.FrameExit {
			bin = out
			break
		}
		if i > 100 {
			t.Fatal("no exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, _, code := c.run("", "attach", "--base64", "b")
	if code != 0 {
		t.Fatalf("attach --base64: status %d", code)
	}
	var decoded []byte
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		line := sc.Text()
		b, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if _, err := wire.ParseFrame(b); err != nil {
			t.Fatalf("line %d is not one frame: %v", n, err)
		}
		decoded = append(decoded, b...)
		n++
	}
	// The same frames, but for the order across the two streams.
	if got, want := frameSet(t, decoded), frameSet(t, []byte(bin)); got != want {
		t.Fatalf("base64 frames %s, binary %s", got, want)
	}
	if strings.ContainsAny(out, "\x00\r\033") {
		t.Fatalf("base64 output carries raw bytes: %q", out)
	}
}

func frameSet(t *testing.T, b []byte) string {
	var so, se bytes.Buffer
	var last wire.Frame
	for _, f := range frames(t, b) {
		if f.Stream == wire.StreamStderr {
			se.Write(f.Payload)
		} else if f.Kind == wire.FrameData {
			so.Write(f.Payload)
		}
		last = f
	}
	return fmt.Sprintf("stdout %q stderr %q last %v %s", so.String(), se.String(), last.Kind, last.Payload)
}

// TestBoundedAttach: --max-bytes and --lease end with the lease-end frame
// whose cursors resume byte-exactly, and a bounded attach never waits for
// the session to end.
func TestBoundedAttach(t *testing.T) {
	c := newCLI(t)
	// 300 KiB of stdout, then a pause, then the rest and the exit.
	script := `head -c 307200 /dev/urandom | od -An -v -tx1 | head -c 307200; sleep 1; echo tail; echo e >&2`
	if _, code := c.json("", "spawn", "--id", "big", "--", "sh", "-c", script); code != 0 {
		t.Fatal("spawn")
	}
	var so, se int64
	var all bytes.Buffer
	rounds := 0
	for {
		rounds++
		if rounds > 200 {
			t.Fatal("no end after 200 bounded attaches")
		}
		start := time.Now()
		out, _, status := c.run("", "attach", "--max-bytes", "65536", "--lease", "300ms",
			"--stdout", fmt.Sprint(so), "--stderr", fmt.Sprint(se), "big")
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("a 300ms lease took %v", el)
		}
		fs := frames(t, []byte(out))
		if len(fs) == 0 {
			t.Fatal("no frames")
		}
		var sent int64
		for _, f := range fs[:len(fs)-1] {
			if f.Kind != wire.FrameData {
				continue
			}
			if f.Stream == wire.StreamStdout {
				all.Write(f.Payload)
				so = f.End()
			} else {
				se = f.End()
			}
			sent += int64(len(f.Payload))
		}
		if sent > 65536+64<<10 {
			t.Fatalf("a 64 KiB bounded attach sent %d bytes", sent)
		}
		last := fs[len(fs)-1]
		if status != 0 {
			t.Fatalf("attach status %d", status)
		}
		if last.Kind == wire.FrameExit {
			break
		}
		we, err := last.Err()
		if err != nil || !IsLeaseEnd(we) {
			t.Fatalf("last frame %v %v, want the lease end", last.Kind, we)
		}
		if we.Detail != fmt.Sprintf("lease ended: stdout=%d stderr=%d", so, se) {
			t.Fatalf("lease end %q, want the cursors stdout=%d stderr=%d", we.Detail, so, se)
		}
	}
	if rounds < 6 {
		t.Fatalf("%d rounds: max-bytes did not bound the attaches", rounds)
	}
	out, _, _ := c.run("", "attach", "--text", "big")
	if all.String() != out {
		t.Fatalf("bounded attaches gave %d bytes, a whole attach %d; they differ", all.Len(), len(out))
	}
	if !strings.HasSuffix(all.String(), "tail\n") || all.Len() != 307200+5 || se != 2 {
		t.Fatalf("got %d stdout bytes (tail %q), stderr cursor %d", all.Len(), all.String()[max(0, all.Len()-8):], se)
	}
}

// TestAttachAck: --ack answers a silent session's attach at once with a
// heartbeat, and a refused one with only its error frame.
func TestAttachAck(t *testing.T) {
	c := newCLI(t)
	if _, code := c.json("", "spawn", "--id", "quiet", "--", "sleep", "30"); code != 0 {
		t.Fatal("spawn")
	}
	t.Cleanup(func() { c.run("", "terminate", "--grace", "10ms", "quiet") })
	out, _, status := c.run("", "attach", "--ack", "--heartbeat", "1h", "--lease", "300ms", "quiet")
	fs := frames(t, []byte(out))
	if status != 0 || len(fs) != 2 || fs[0].Kind != wire.FrameHeartbeat || fs[1].Kind != wire.FrameError {
		t.Fatalf("attach --ack of a silent session: %v status %d, want heartbeat then the lease end", fs, status)
	}
	if we, _ := fs[1].Err(); !IsLeaseEnd(we) || we.Detail != "lease ended: stdout=0 stderr=0" {
		t.Fatalf("lease end %v", we)
	}
	out, _, status = c.run("", "attach", "--ack", "nope")
	if fs := frames(t, []byte(out)); status != wire.ShimExitNotFound || len(fs) != 1 || fs[0].Kind != wire.FrameError {
		t.Fatalf("attach --ack of an unknown session: %v status %d", fs, status)
	}
}

// TestPrune: spawn --prune removes ended sessions older than the age whose
// shims are gone, and keeps running ones and young ones.
func TestPrune(t *testing.T) {
	c := newCLI(t)
	for _, id := range []string{"old1", "old2"} {
		if _, code := c.json("", "spawn", "--id", id, "--", "true"); code != 0 {
			t.Fatal("spawn")
		}
	}
	if _, code := c.json("", "spawn", "--id", "run", "--", "sleep", "30"); code != 0 {
		t.Fatal("spawn")
	}
	t.Cleanup(func() { c.run("", "terminate", "--grace", "10ms", "run") })
	// Wait for the old ones' shims to go.
	for i := 0; ; i++ {
		_, e1 := os.Stat(filepath.Join(c.root, "old1", sessiondir.SocketFile))
		_, e2 := os.Stat(filepath.Join(c.root, "old2", sessiondir.SocketFile))
		if errors.Is(e1, os.ErrNotExist) && errors.Is(e2, os.ErrNotExist) {
			break
		}
		if i > 500 {
			t.Fatal("the shims of ended sessions did not exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, code := c.json("", "spawn", "--id", "young", "--prune", "1h", "--", "true"); code != 0 {
		t.Fatal("spawn --prune 1h")
	}
	if a, _ := c.json("", "list"); len(a.Sessions) != 4 {
		t.Fatalf("--prune 1h removed young sessions: %d left, want 4", len(a.Sessions))
	}
	time.Sleep(20 * time.Millisecond)
	if _, code := c.json("", "spawn", "--id", "new", "--prune", "10ms", "--", "sleep", "0"); code != 0 {
		t.Fatal("spawn --prune")
	}
	a, _ := c.json("", "list")
	var ids []string
	for _, s := range a.Sessions {
		ids = append(ids, s.ID)
	}
	got := strings.Join(ids, " ")
	// young may or may not have been pruned (its shim may linger); old1
	// and old2 must be gone, run and new kept.
	if strings.Contains(got, "old1") || strings.Contains(got, "old2") || !strings.Contains(got, "run") || !strings.Contains(got, "new") {
		t.Fatalf("after --prune 10ms: sessions %q, want old1 and old2 gone, run and new kept", got)
	}
}
