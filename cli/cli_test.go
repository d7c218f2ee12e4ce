package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/stream"
	"github.com/agentrunner/runner/wire"
)

func TestSandboxRoundTrip(t *testing.T) {
	d := sharedDaemon(t)
	const name = "round-trip"

	created := decode[wire.Sandbox](t, d.ok(t, "create", name, "--json"))
	if created.Name != name || created.State != wire.SandboxRunning || created.Incarnation == "" {
		t.Fatalf("create --json: got %+v, want a running %q with an incarnation", created, name)
	}
	// Idempotent: the same incarnation again.
	again := decode[wire.Sandbox](t, d.ok(t, "--json", "create", name))
	if again.Incarnation != created.Incarnation {
		t.Errorf("second create: got incarnation %q, want %q", again.Incarnation, created.Incarnation)
	}
	got := decode[wire.Sandbox](t, d.ok(t, "get", name, "--json"))
	if got.Incarnation != created.Incarnation || got.Workspace != created.Workspace {
		t.Errorf("get --json: got %+v, want %+v", got, created)
	}
	list := decode[[]wire.Sandbox](t, d.ok(t, "ls", "--json"))
	if !slices.ContainsFunc(list, func(s wire.Sandbox) bool { return s.Name == name }) {
		t.Errorf("ls --json: %q missing from %+v", name, list)
	}
	if out := d.ok(t, "ls"); !strings.Contains(out, name) || !strings.HasPrefix(out, "NAME") {
		t.Errorf("ls: got %q, want a table with %q", out, name)
	}
	if out := d.ok(t, "get", name); !strings.Contains(out, "incarnation: "+created.Incarnation) {
		t.Errorf("get: got %q, want the incarnation line", out)
	}

	if out := d.ok(t, "rm", name); out != "removed "+name+"\n" {
		t.Errorf("rm: got %q", out)
	}
	_, stderr, code := d.cli(t, nil, "get", name)
	if code != exitNotFound {
		t.Errorf("get after rm: exit %d, want %d (not_found); stderr %q", code, exitNotFound, stderr)
	}
	if want := "runner: get " + name + ": not_found: "; !strings.HasPrefix(stderr, want) {
		t.Errorf("get after rm: stderr %q, want prefix %q", stderr, want)
	}
	list = decode[[]wire.Sandbox](t, d.ok(t, "ls", "--json"))
	if slices.ContainsFunc(list, func(s wire.Sandbox) bool { return s.Name == name }) {
		t.Errorf("ls --json after rm still lists %q", name)
	}
	// rm -f of an absent sandbox succeeds: it is gone either way
	// (without -f it says so and fails: TestRmAbsent).
	d.ok(t, "rm", "-f", name)
}

func TestExec(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "exec-box")

	tests := []struct {
		name       string
		args       []string
		stdin      []byte
		wantOut    string
		wantErr    string // exact stderr; "" means empty
		wantErrHas string // or a substring of it
		wantCode   int
	}{
		{name: "exit code", args: []string{"--", "sh", "-c", "exit 3"}, wantCode: 3},
		{name: "success", args: []string{"true"}, wantCode: 0},
		{name: "bytes exact", args: []string{"--", "sh", "-c", `printf 'out\000\377\n'; printf 'err\001\r\n' >&2`},
			wantOut: "out\x00\xff\n", wantErr: "err\x01\r\n"},
		{name: "no -- needed", args: []string{"sh", "-c", "echo $0 $1", "a", "b"}, wantOut: "a b\n"},
		{name: "stdin with -i", args: []string{"-i", "--", "sh", "-c", "tr a-z A-Z; exit 4"}, stdin: []byte("hi\x00there"),
			wantOut: "HI\x00THERE", wantCode: 4},
		{name: "env and cwd", args: []string{"--env", "A=1", "--env", "B=two", "--", "sh", "-c", "echo $A$B; pwd"}},
		{name: "signal death is 128+n", args: []string{"--", "sh", "-c", "kill -9 $$"}, wantCode: 137,
			wantErrHas: "killed by signal 9 (SIGKILL)"},
		{name: "max-time", args: []string{"--max-time", "200ms", "--", "sleep", "30"}, wantCode: 143,
			wantErrHas: "terminated after --max-time"},
		// Issue #17 item 6: 127 as sh exits, not invalid (252).
		{name: "no such program", args: []string{"--", "/no/such/program"}, wantCode: 127,
			wantErrHas: "runner: /no/such/program: command not found in sandbox exec-box"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := d.cli(t, tt.stdin, append([]string{"exec", box}, tt.args...)...)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; stderr %q", code, tt.wantCode, errOut)
			}
			if tt.name == "env and cwd" {
				lines := strings.Split(out, "\n")
				// The workspace as the sandbox's commands see it
				// (runner get's workspace): /workspace in a pod.
				ws := decode[wire.Sandbox](t, d.ok(t, "get", box, "--json")).Workspace
				if lines[0] != "1two" || lines[1] != ws || ws == "" {
					t.Errorf("stdout %q: want 1two and the workspace", out)
				}
				return
			}
			if out != tt.wantOut {
				t.Errorf("stdout: got %q, want %q", out, tt.wantOut)
			}
			if tt.wantErrHas != "" {
				if !strings.Contains(errOut, tt.wantErrHas) {
					t.Errorf("stderr: got %q, want it to contain %q", errOut, tt.wantErrHas)
				}
			} else if errOut != tt.wantErr {
				t.Errorf("stderr: got %q, want %q", errOut, tt.wantErr)
			}
		})
	}

	// The exec is a real session, listed with its exit.
	if _, e, code := d.cli(t, nil, "exec", box, "--id", "named-exec", "--", "sh", "-c", "exit 5"); code != 5 {
		t.Fatalf("exec --id named-exec: exit %d, want 5; stderr %q", code, e)
	}
	s := decode[wire.Session](t, d.ok(t, "sessions", box, "named-exec", "--json"))
	if s.Exit == nil || s.Exit.Code != 5 {
		t.Errorf("sessions --json of an exec: got %+v, want exit code 5", s)
	}
}

func TestSpawnLogs(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "logs-box")

	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf 0123456789; printf ERR >&2; sleep 0.3; printf tail"))
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("spawn printed %q, want one session id", id)
	}
	// -f follows to the end; then replay from a cursor.
	if got := d.ok(t, "logs", box, id, "-f"); got != "0123456789tail" {
		t.Errorf("logs -f: got %q, want %q", got, "0123456789tail")
	}
	if got := d.ok(t, "logs", box, id, "--cursor", "4"); got != "456789tail" {
		t.Errorf("logs --cursor 4: got %q, want %q", got, "456789tail")
	}
	if got := d.ok(t, "logs", box, id, "--stream", "stderr", "--cursor", "1", "-f"); got != "RR" {
		t.Errorf("logs --stream stderr --cursor 1: got %q, want %q", got, "RR")
	}
	if got := d.ok(t, "logs", box, id, "--cursor", "14"); got != "" {
		t.Errorf("logs at the end: got %q, want nothing", got)
	}
	_, errOut, code := d.cli(t, nil, "logs", box, id, "--cursor", "99")
	if code != exitInvalid || !strings.Contains(errOut, "invalid") {
		t.Errorf("logs beyond the end: exit %d, stderr %q; want %d invalid", code, errOut, exitInvalid)
	}

	// A given id; --json prints the session.
	s := decode[wire.Session](t, d.ok(t, "spawn", box, "--id", "given", "--json", "--", "true"))
	if s.ID != "given" || s.Sandbox != box {
		t.Errorf("spawn --id given --json: got %+v", s)
	}
	list := decode[[]wire.Session](t, d.ok(t, "sessions", box, "--json"))
	if !slices.ContainsFunc(list, func(s wire.Session) bool { return s.ID == id }) ||
		!slices.ContainsFunc(list, func(s wire.Session) bool { return s.ID == "given" }) {
		t.Errorf("sessions --json: got %+v, want %s and given", list, id)
	}
}

func TestStdin(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "stdin-box")

	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "cat"))
	d.ok(t, "write", box, id, "hello")             // DATA plus a newline
	d.ok(t, "write", box, id, "-n", "no-newline|") // exactly DATA
	if _, e, code := d.cli(t, []byte("raw\x00bytes"), "write", box, id, "-"); code != 0 {
		t.Fatalf("write -: exit %d: %s", code, e)
	}
	d.ok(t, "close-stdin", box, id)
	if got, want := d.ok(t, "logs", box, id, "-f"), "hello\nno-newline|raw\x00bytes"; got != want {
		t.Errorf("logs -f of cat: got %q, want %q", got, want)
	}
	s := decode[wire.Session](t, d.ok(t, "sessions", box, id, "--json"))
	if s.State != wire.SessionExited || s.Exit == nil || s.Exit.Code != 0 {
		t.Errorf("cat after close-stdin: got %+v, want exited 0", s)
	}
	_, errOut, code := d.cli(t, nil, "write", box, id, "late")
	if code != exitCommandExited || !strings.Contains(errOut, "command_exited") {
		t.Errorf("write after exit: exit %d, stderr %q; want %d command_exited", code, errOut, exitCommandExited)
	}
}

func TestTerminateSignal(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "term-box")

	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sleep", "60"))
	if got := d.ok(t, "terminate", box, id, "--grace", "2s"); got != id+" killed by SIGTERM (code 143)\n" {
		t.Errorf("terminate: got %q", got)
	}
	x := decode[wire.Exit](t, d.ok(t, "terminate", box, id, "--json"))
	if x.Reason != wire.ExitSignaled || x.Signal != 15 {
		t.Errorf("terminate --json of an ended session: got %+v, want signaled 15", x)
	}

	// A shell that ignores TERM is killed after the grace.
	// It says when the trap is set: spawn answers once sh runs, which may
	// be before it has read its script (slower in a pod, whose root is an
	// overlay), and a TERM before the trap ends it with SIGTERM.
	id = strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "trap '' TERM; echo trapped; while :; do sleep 0.1; done"))
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(d.ok(t, "logs", box, id), "trapped"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the TERM-ignoring shell never said its trap is set")
		}
	}
	start := time.Now()
	if got := d.ok(t, "terminate", box, id, "--grace", "300ms"); !strings.Contains(got, "SIGKILL") {
		t.Errorf("terminate of a TERM-ignoring shell: got %q, want SIGKILL", got)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("terminate took %v", el)
	}

	id = strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "trap 'exit 9' USR1; while :; do sleep 0.1; done"))
	time.Sleep(200 * time.Millisecond) // let the shell install its trap
	d.ok(t, "signal", box, id, "USR1")
	if got := d.ok(t, "logs", box, id, "-f"); got != "" {
		t.Errorf("logs: %q", got)
	}
	if s := decode[wire.Session](t, d.ok(t, "sessions", box, id, "--json")); s.Exit == nil || s.Exit.Code != 9 {
		t.Errorf("after signal USR1: got %+v, want exit 9", s)
	}
}

// TestErrors checks the documented exit codes and the error format.
func TestErrors(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "err-box")

	tests := []struct {
		name     string
		args     []string
		code     int
		prefix   string
		contains string
	}{
		{"get missing sandbox", []string{"get", "no-such-box"}, exitNotFound, "runner: get no-such-box: not_found: ", ""},
		{"exec in missing sandbox", []string{"exec", "no-such-box", "--", "true"}, exitNotFound, "runner: exec no-such-box: not_found: ", "runner create NAME"},
		{"sessions of missing sandbox", []string{"sessions", "no-such-box"}, exitNotFound, "runner: sessions no-such-box: not_found: ", ""},
		{"logs of missing session", []string{"logs", box, "nope"}, exitNotFound, "runner: logs " + box + " nope: not_found: ", ""},
		{"attach missing session", []string{"attach", box, "nope"}, exitNotFound, "runner: attach " + box + " nope: not_found: ", ""},
		{"bad name", []string{"create", "Bad_Name"}, exitInvalid, "runner: create Bad_Name: invalid: ", ""},
		{"unknown command", []string{"frobnicate"}, exitUsage, `runner: unknown command "frobnicate"`, ""},
		{"missing argument", []string{"get"}, exitUsage, "runner get: usage: runner get NAME", ""},
		{"unknown flag", []string{"ls", "--bogus"}, exitUsage, "runner ls: flag provided but not defined: -bogus (see runner ls --help)", ""},
		{"exec without a command", []string{"exec", box}, exitUsage, "runner exec: no command to run", ""},
		{"signal missing session", []string{"signal", box, "nope", "TERM"}, exitNotFound, "runner: signal " + box + " nope: not_found", ""},
		{"bad signal", []string{"signal", box, "nope", "NOPE"}, exitInvalid, "runner: signal " + box + " nope: invalid: ", "NOPE"},
		{"wrong token", []string{"--token-file", writeFile(t, "wrong-token"), "ls"}, exitDenied, "runner: list sandboxes: denied: ", "hint:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, code := d.cli(t, nil, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tt.code, errOut)
			}
			if !strings.HasPrefix(errOut, tt.prefix) {
				t.Errorf("stderr %q, want prefix %q", errOut, tt.prefix)
			}
			if !strings.Contains(errOut, tt.contains) {
				t.Errorf("stderr %q, want it to contain %q", errOut, tt.contains)
			}
		})
	}

	t.Run("help exits 0", func(t *testing.T) {
		for _, args := range [][]string{{"--help"}, {"attach", "--help"}, {"help", "exec"}} {
			out, _, code := d.cli(t, nil, args...)
			if code != 0 || out == "" {
				t.Errorf("runner %v: exit %d, stdout %q", args, code, out)
			}
		}
		out, _, _ := d.cli(t, nil, "--help")
		for _, want := range []string{"253  not_found", "255  unavailable", "RUNNERD_URL"} {
			if !strings.Contains(out, want) {
				t.Errorf("--help lacks %q", want)
			}
		}
	})
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDaemonDown: a stopped daemon is unavailable (255), never not_found,
// and the message says what to do.
func TestDaemonDown(t *testing.T) {
	d, state := ownDaemon(t)
	d.ok(t, "create", "down-box")
	d.stop()

	for _, tt := range []struct {
		name string
		env  []string
		args []string
	}{
		// The socket is gone with the daemon; discovery then uses
		// RUNNERD_LISTEN (never the host's default port, which another
		// runnerd may hold).
		{"discovered", append(d.env(), "RUNNERD_LISTEN="+d.addr), []string{"get", "down-box"}},
		{"tcp url", cliEnv("RUNNERD_STATE=" + state), []string{"--url", "http://" + d.addr, "get", "down-box"}},
		{"exec", cliEnv("RUNNERD_STATE=" + state), []string{"--url", d.addr, "exec", "down-box", "--", "true"}},
		{"no daemon ever", cliEnv("RUNNERD_STATE=" + t.TempDir()), []string{"ls"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, errb, code := runCLIEnv(tt.env, nil, tt.args...)
			errOut := string(errb)
			if code != exitUnavailable {
				t.Errorf("exit %d, want %d (unavailable); stderr %q", code, exitUnavailable, errOut)
			}
			if !strings.Contains(errOut, ": unavailable: ") || !strings.Contains(errOut, "runner: hint:") || !strings.Contains(errOut, "runnerd") {
				t.Errorf("stderr %q: want an unavailable error with a hint", errOut)
			}
		})
	}
}

func TestSuspendResume(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "park-box")
	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sleep", "60"))
	if got := d.ok(t, "suspend", box); got != box+" suspended\n" {
		t.Errorf("suspend: got %q", got)
	}
	if s := decode[wire.Session](t, d.ok(t, "sessions", box, id, "--json")); s.Exit == nil || s.Exit.Reason != wire.ExitSignaled {
		t.Errorf("session after suspend: got %+v, want signaled", s)
	}
	_, errOut, code := d.cli(t, nil, "exec", box, "true")
	if code != exitInvalid || !strings.Contains(errOut, "invalid") {
		t.Errorf("exec in a suspended sandbox: exit %d, stderr %q; want %d invalid", code, errOut, exitInvalid)
	}
	sb := decode[wire.Sandbox](t, d.ok(t, "resume", box, "--json"))
	if sb.State != wire.SandboxRunning {
		t.Errorf("resume --json: got %+v", sb)
	}
	d.ok(t, "exec", box, "true")
}

// TestAttachPipes: a pipes session streams stdout to stdout and stderr to
// stderr, and runner exits with the command's code; an ended session
// replays at once.
func TestAttachPipes(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "pipes-box")
	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf out1; printf err1 >&2; sleep 0.5; printf out2; exit 4"))
	out, errOut, code := d.cli(t, nil, "attach", box, id)
	if out != "out1out2" || errOut != "err1" || code != 4 {
		t.Errorf("attach: stdout %q stderr %q exit %d; want out1out2, err1, 4", out, errOut, code)
	}
	out, errOut, code = d.cli(t, nil, "attach", box, id, "--cursor", "4", "--stderr-cursor", "3")
	if out != "out2" || errOut != "1" || code != 4 {
		t.Errorf("attach from cursors: stdout %q stderr %q exit %d; want out2, 1, 4", out, errOut, code)
	}
	// -i sends stdin and closes it at EOF.
	id = strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "tr a-z A-Z; exit 6"))
	out, errOut, code = d.cli(t, []byte("piped in"), "attach", box, id, "-i")
	if out != "PIPED IN" || code != 6 {
		t.Errorf("attach -i: stdout %q stderr %q exit %d; want PIPED IN, 6", out, errOut, code)
	}
}

// TestExecInterrupt: Ctrl-C (SIGINT to runner) is forwarded to the
// command, and runner exits with the command's answer to it.
func TestExecInterrupt(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "intr-box")
	cmd := d.command("exec", box, "--", "sh", "-c", "trap 'echo got-int; exit 42' INT; echo ready; while :; do sleep 0.1; done")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the command runs (its session is listed as running).
	deadline := time.Now().Add(10 * time.Second)
	for {
		list := decode[[]wire.Session](t, d.ok(t, "sessions", box, "--json"))
		if len(list) == 1 && list[0].State == wire.SessionRunning && strings.Contains(d.ok(t, "logs", box, list[0].ID), "ready") {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("exec did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 42 || out.String() != "ready\ngot-int\n" {
		t.Errorf("exec after SIGINT: exit %d stdout %q; want 42 and ready, got-int", code, out.String())
	}
}

// TestSessionsTableAndRm: the sessions table says how much output each
// stream holds and whether a session ended because it was terminated; an
// ended session can be deleted, a running one cannot.
func TestSessionsTableAndRm(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "table-box")
	done := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf abc; printf de >&2"))
	d.ok(t, "logs", box, done, "-f")
	stopped := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sleep", "60"))
	d.ok(t, "terminate", box, stopped, "--grace", "2s")
	running := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sleep", "60"))
	defer d.cli(t, nil, "terminate", box, running, "--grace", "100ms")

	table := d.ok(t, "sessions", box)
	rowOf := func(id string) string {
		for _, line := range strings.Split(table, "\n") {
			if strings.HasPrefix(line, id+" ") {
				return line
			}
		}
		t.Fatalf("no row for %s in:\n%s", id, table)
		return ""
	}
	if f := strings.Fields(rowOf(done)); len(f) < 5 || f[2] != "0" || f[4] != "3/2" {
		t.Errorf("row of the finished session: %q, want exit 0 and output 3/2", rowOf(done))
	}
	if row := rowOf(stopped); !strings.Contains(row, "(SIGTERM), terminated") {
		t.Errorf("row of the terminated session: %q, want it marked terminated", row)
	}

	_, stderr, code := d.cli(t, nil, "rm-session", box, running)
	if code == 0 || !strings.Contains(stderr, "invalid") {
		t.Errorf("rm-session of a running session: exit %d, %q; want refused as invalid", code, stderr)
	}
	if got := d.ok(t, "rm-session", box, done, stopped); got != "removed session "+done+"\nremoved session "+stopped+"\n" {
		t.Errorf("rm-session: got %q", got)
	}
	if _, _, code := d.cli(t, nil, "sessions", box, done); code != 253 {
		t.Errorf("sessions of a deleted session: exit %d, want 253 (not_found)", code)
	}
	d.ok(t, "rm-session", box, done) // absent is success
}

// TestExitStatusFromErrorTable: every code of wire.ErrorTable, as the
// adapter error a client returns, makes runner exit with the table's
// status (codeOf), and an error frame of that code does too.
func TestExitStatusFromErrorTable(t *testing.T) {
	for _, row := range wire.ErrorTable {
		err, ok := stream.KindError("runner", &wire.Error{Code: row.Code, Detail: "d"}, "d")
		if !ok {
			t.Fatalf("no error for %s", row.Code)
		}
		code, name := codeOf(fmt.Errorf("get sandbox: %w", err))
		if code != row.Exit || name != string(row.Code) {
			t.Errorf("codeOf(%s) = %d %s, want %d %s", row.Code, code, name, row.Exit, row.Code)
		}
	}
}

// TestExitTableText: runner --help's exit table prints the statuses
// wire.ErrorTable assigns, so the text cannot drift from the code.
func TestExitTableText(t *testing.T) {
	for _, row := range wire.ErrorTable {
		want := fmt.Sprintf("%d  %s", row.Exit, row.Code)
		if row.Exit == wire.RunnerExitOther {
			want = fmt.Sprintf("%d  ", row.Exit)
			if !strings.Contains(exitTable, want) || !strings.Contains(exitTable, string(row.Code)) {
				t.Errorf("exit table does not list %s under %d", row.Code, row.Exit)
			}
			continue
		}
		if !strings.Contains(exitTable, want) {
			t.Errorf("exit table has no line %q", want)
		}
	}
}
