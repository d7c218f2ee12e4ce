package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/gobuild"
	"github.com/agentrunner/runner/wire"
)

// The tests of issue #17's CLI items. Exit statuses are written as
// numbers here on purpose: they are the documented interface (docs/cli.md),
// and a test that named the constants would follow a wrong change.

// TestUsageGoesToStderr (item 7): after a mistake on the command line the
// usage text goes to stderr and runner exits 2, so that
// `out=$(runner --bogus ls)` captures nothing; a request runner refuses to
// send is a usage error (2) too, not the daemon's invalid (252).
func TestUsageGoesToStderr(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "usage-box")
	// A mistake is one line naming where the help is (issue 25 item 7),
	// never the whole help; the line is exact.
	tests := []struct {
		name    string
		args    []string
		wantErr string // exact stderr, or a prefix when it ends in "..."
	}{
		{"bogus global flag", []string{"--bogus", "ls"}, "runner: flag provided but not defined: -bogus (see runner --help)\n"},
		{"bogus command flag", []string{"ls", "--bogus"}, "runner ls: flag provided but not defined: -bogus (see runner ls --help)\n"},
		{"combined flags not all known", []string{"exec", box, "-iz", "--", "true"}, "runner exec: flag provided but not defined: -iz (see runner exec --help)\n"},
		{"no command", nil, "runner: drive runnerd..."},
		{"bad flag value", []string{"logs", box, "x", "--cursor", "abc"}, "runner logs: invalid value \"abc\" for flag -cursor: parse error (see runner logs --help)\n"},
		{"unknown command", []string{"frobnicate"}, "runner: unknown command \"frobnicate\" (see runner --help)\n"},
		{"mistyped command", []string{"sesions", box}, "runner: unknown command \"sesions\"; did you mean \"sessions\"? (see runner --help)\n"},
		{"mistyped command 2", []string{"exce", box}, "runner: unknown command \"exce\"; did you mean \"exec\"? (see runner --help)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := d.cli(t, nil, tt.args...)
			if code != 2 {
				t.Errorf("exit %d, want 2; stderr %q", code, errOut)
			}
			if out != "" {
				t.Errorf("stdout: got %d bytes (%.80q...), want none", len(out), out)
			}
			if prefix, ok := strings.CutSuffix(tt.wantErr, "..."); ok {
				if !strings.HasPrefix(errOut, prefix) {
					t.Errorf("stderr %.300q, want it to start with %q", errOut, prefix)
				}
			} else if errOut != tt.wantErr {
				t.Errorf("stderr %q, want %q", errOut, tt.wantErr)
			}
		})
	}
	// Help asked for still goes to stdout and exits 0.
	if out, errOut, code := d.cli(t, nil, "ls", "--help"); code != 0 || !strings.HasPrefix(out, "Usage: runner ls") || errOut != "" {
		t.Errorf("ls --help: exit %d stdout %.80q stderr %q; want 0, usage on stdout only", code, out, errOut)
	}
}

var versionedRunner, versionedRunnerd gobuild.Once

// versionedBins builds runner and runnerd stamped with versions that
// differ (runner-v9 and runnerd-v1 in binDir), once.
func versionedBins(t *testing.T) (runner, runnerd string) {
	t.Helper()
	return versionedRunner.Build(t, filepath.Join(binDir, "runner-v9"), "v9.0.0-test", "../cmd/runner"),
		versionedRunnerd.Build(t, filepath.Join(binDir, "runnerd-v1"), "v1.0.0-test", "../cmd/runnerd")
}

// TestVersion (item 3): runner version and runner --version print the
// client's version and the daemon's (from /healthz), and warn on stderr
// when the two are known builds that differ.
func TestVersion(t *testing.T) {
	d := sharedDaemon(t)
	out, errOut, code := d.cli(t, nil, "version")
	lines := strings.Split(out, "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "client: ") || !strings.HasPrefix(lines[1], "daemon: ") || lines[2] != "" {
		t.Fatalf("version: exit %d stdout %q stderr %q; want client: and daemon: lines", code, out, errOut)
	}
	// One build: the same version on both ends, and no warning.
	if c, dv := strings.TrimPrefix(lines[0], "client: "), strings.TrimPrefix(lines[1], "daemon: "); c != dv || c == "" {
		t.Errorf("version: client %q, daemon %q; want the same non-empty version", c, dv)
	}
	if errOut != "" {
		t.Errorf("version of one build: stderr %q, want none", errOut)
	}
	if out2, _, code := d.cli(t, nil, "--version"); code != 0 || out2 != out {
		t.Errorf("--version: exit %d stdout %q; want %q", code, out2, out)
	}
	v := decode[versions](t, d.ok(t, "version", "--json"))
	if v.Client == "" || v.Client != v.Daemon {
		t.Errorf("version --json: got %+v, want equal versions", v)
	}

	// Built apart: both versions, and a warning.
	runnerV9, runnerdV1 := versionedBins(t)
	d1, err := startDaemonBin(runnerdV1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d1.stop)
	cmd := exec.Command(runnerV9, "--version")
	cmd.Env = d1.env()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatalf("runner-v9 --version: %v; stderr %q", err, e.String())
	}
	if got, want := o.String(), "client: v9.0.0-test\ndaemon: v1.0.0-test\n"; got != want {
		t.Errorf("skewed --version: stdout %q, want %q", got, want)
	}
	if !strings.HasPrefix(e.String(), "runner: warning: runner is v9.0.0-test but runnerd is v1.0.0-test") {
		t.Errorf("skewed --version: stderr %q, want the skew warning", e.String())
	}
	// The daemon unreachable: the client's line, then the error (255).
	d2, err := startDaemon(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d2.stop()
	out, errOut, code = d2.cli(t, nil, "version")
	if code != 255 || !strings.HasPrefix(out, "client: ") || strings.Contains(out, "daemon:") || !strings.Contains(errOut, "unavailable") {
		t.Errorf("version without a daemon: exit %d stdout %q stderr %q; want 255, the client line, unavailable", code, out, errOut)
	}
}

// TestExecRejoinsAfterRestart (item 5): runnerd is killed (SIGKILL) and
// restarted on the same state directory while runner exec waits for a
// command that outlives the restart. exec rejoins its session and exits
// with the command's code, printing every byte once.
func TestExecRejoinsAfterRestart(t *testing.T) {
	d, state := ownDaemon(t)
	t.Cleanup(d.stop)
	box := d.sandbox(t, "rejoin-box")
	sb := decode[wire.Sandbox](t, d.ok(t, "get", box, "--json"))

	// The command prints, then waits for a file the test creates only
	// after the restart, then prints again: it outlives the restart
	// whatever the timing.
	cmd := d.command("exec", box, "--id", "rejoin", "--",
		"sh", "-c", "printf 'before\\n'; printf 'err1' >&2; while [ ! -e go ]; do sleep 0.05; done; printf 'after\\n'; printf 'err2' >&2; exit 7")
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		select {
		case <-waited:
		default:
			_ = cmd.Process.Kill()
			<-waited
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		// exec streams: runner itself has printed both before the cut.
		if out.String() == "before\n" && errOut.String() == "err1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the exec's command did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	time.Sleep(300 * time.Millisecond) // runner sees the cut and starts rejoining
	d2, err := startDaemon(state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d2.stop)
	if err := os.WriteFile(filepath.Join(sb.WorkspaceOnHost(), "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
		t.Fatalf("exec did not end after the restart; stdout %q stderr %q", out.String(), errOut.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 7 {
		t.Errorf("exec across a restart: exit %d, want 7; stderr %q", code, errOut.String())
	}
	if got, want := out.String(), "before\nafter\n"; got != want {
		t.Errorf("stdout: got %q, want %q (every byte once)", got, want)
	}
	// exec streams (issue 25 item 1): err1 is printed before the cut,
	// err2 after the rejoin, each once.
	if got, want := errOut.String(), "err1runner: connection to runnerd lost; rejoining session rejoin (the command keeps running)...\nrunner: reconnected\nerr2"; got != want {
		t.Errorf("stderr: got %q, want %q", got, want)
	}
}

// TestCommandNotFound (item 6): a missing command exits 127 and one that
// cannot be run 126, with one clear line, for exec and for spawn; a
// malformed request stays invalid (252).
func TestCommandNotFound(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "cmd-box")
	d.ok(t, "exec", box, "--", "sh", "-c", "printf '#!/bin/sh\\necho hi\\n' > noexec.sh; chmod 644 noexec.sh; mkdir -p adir")
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr string // exact stderr, or a prefix when it ends in "..."
	}{
		{"exec missing", []string{"exec", box, "--", "no-such-cmd", "x"}, 127, "runner: no-such-cmd: command not found in sandbox " + box + "\n"},
		{"exec missing path", []string{"exec", box, "--", "/no/such/program"}, 127, "runner: /no/such/program: command not found in sandbox " + box + "\n"},
		{"exec not executable", []string{"exec", box, "--", "./noexec.sh"}, 126, "runner: ./noexec.sh: command not executable in sandbox " + box + "\n"},
		{"exec a directory", []string{"exec", box, "--", "./adir"}, 126, "runner: ./adir: command not executable in sandbox " + box + "\n"},
		{"spawn missing", []string{"spawn", box, "--", "no-such-cmd"}, 127, "runner: no-such-cmd: command not found in sandbox " + box + "\n"},
		{"spawn not executable", []string{"spawn", box, "--tty", "--", "./noexec.sh"}, 126, "runner: ./noexec.sh: command not executable in sandbox " + box + "\n"},
		{"malformed: bad cwd", []string{"exec", box, "--cwd", "nowhere", "--", "true"}, 252, "runner: exec " + box + ": invalid: ..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := d.cli(t, nil, tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tt.code, errOut)
			}
			if p, ok := strings.CutSuffix(tt.wantErr, "..."); ok {
				if !strings.HasPrefix(errOut, p) {
					t.Errorf("stderr %q, want prefix %q", errOut, p)
				}
			} else if errOut != tt.wantErr {
				t.Errorf("stderr %q, want %q", errOut, tt.wantErr)
			}
			if out != "" {
				t.Errorf("stdout %q, want none", out)
			}
		})
	}
	// --json: the error object says it, exec_error included.
	_, errOut, code := d.cli(t, nil, "exec", box, "--json", "--", "no-such-cmd")
	je := decode[jsonError](t, errOut)
	want := jsonErrorBody{Kind: "invalid", Op: "exec " + box, Detail: "no-such-cmd: command not found in sandbox " + box, ExitCode: 127, ExecError: "not_found"}
	if code != 127 || je.Error != want {
		t.Errorf("exec --json of a missing command: exit %d, stderr %q; want 127 and %+v", code, errOut, want)
	}
}

// TestJSONEverywhere (item 9): rm and rm-session print JSON with --json;
// errors in --json mode are one JSON object on stderr; exec --json names
// its base64 fields.
func TestJSONEverywhere(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "json-box")
	other := d.sandbox(t, "json-box-2")

	xout, xerr, code := d.cli(t, nil, "exec", box, "--json", "--", "sh", "-c", `printf 'o\377'; printf 'e' >&2; exit 3`)
	if code != 3 || xerr != "" {
		t.Errorf("exec --json: exit %d stderr %q, want 3 and nothing", code, xerr)
	}
	x := decode[map[string]json.RawMessage](t, xout)
	for _, k := range []string{"session", "stdout_base64", "stderr_base64", "stdout_truncated", "stderr_truncated", "timed_out", "exit"} {
		if _, ok := x[k]; !ok {
			t.Errorf("exec --json: no %q in %v", k, x)
		}
	}
	var stdout, stderr []byte
	_ = json.Unmarshal(x["stdout_base64"], &stdout)
	_ = json.Unmarshal(x["stderr_base64"], &stderr)
	if string(stdout) != "o\xff" || string(stderr) != "e" {
		t.Errorf("exec --json: stdout %q stderr %q, want o\\xff and e", stdout, stderr)
	}

	// A timeout in --json mode: the object says it, stderr stays empty.
	xout, xerr, code = d.cli(t, nil, "exec", box, "--json", "--max-time", "200ms", "--", "sleep", "30")
	if tx := decode[execJSON](t, xout); code != 143 || xerr != "" || !tx.TimedOut || tx.Exit.Signal != 15 {
		t.Errorf("exec --json --max-time: exit %d stderr %q object %+v; want 143, nothing, timed_out and SIGTERM", code, xerr, tx)
	}

	id1 := strings.TrimSpace(d.ok(t, "spawn", box, "--", "true"))
	id2 := strings.TrimSpace(d.ok(t, "spawn", box, "--", "true"))
	d.ok(t, "logs", box, id1, "-f")
	d.ok(t, "logs", box, id2, "-f")
	rs := decode[removedSessions](t, d.ok(t, "rm-session", box, id1, id2, "--json"))
	if rs.Sandbox != box || strings.Join(rs.Removed, ",") != id1+","+id2 {
		t.Errorf("rm-session --json: got %+v, want %s and [%s %s]", rs, box, id1, id2)
	}
	if got := d.ok(t, "rm", other, "--json"); got != "{\n  \"removed\": [\n    \""+other+"\"\n  ]\n}\n" {
		t.Errorf("rm --json: got %q", got)
	}

	tests := []struct {
		name string
		args []string
		want jsonErrorBody // Detail checked for being non-empty only
	}{
		{"not found", []string{"get", "no-such-box", "--json"}, jsonErrorBody{Kind: "not_found", Op: "get no-such-box", ExitCode: 253}},
		{"invalid", []string{"--json", "create", "Bad_Name"}, jsonErrorBody{Kind: "invalid", Op: "create Bad_Name", ExitCode: 252}},
		{"usage", []string{"--json", "get"}, jsonErrorBody{Kind: "usage", Op: "get", ExitCode: 2}},
		{"bad flag", []string{"--json", "ls", "--bogus"}, jsonErrorBody{Kind: "usage", Op: "ls", ExitCode: 2}},
		{"denied", []string{"--json", "--token-file", writeFile(t, "wrong"), "ls"}, jsonErrorBody{Kind: "denied", Op: "list sandboxes", ExitCode: 251,
			Hint: "the token does not match the daemon's: use --token-file STATE/token or RUNNERD_TOKEN"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := d.cli(t, nil, tt.args...)
			if code != tt.want.ExitCode || out != "" {
				t.Errorf("exit %d stdout %q, want %d and nothing", code, out, tt.want.ExitCode)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasSuffix(errOut, "\n") {
				t.Errorf("stderr %q, want one line", errOut)
			}
			got := decode[jsonError](t, errOut).Error
			if got.Detail == "" {
				t.Errorf("no detail in %q", errOut)
			}
			got.Detail = ""
			if got != tt.want {
				t.Errorf("stderr %q: got %+v, want %+v", errOut, got, tt.want)
			}
		})
	}
}

// TestSessionsOrderAndEmpty (item 10): sessions are listed by start time
// (not by id), and empty listings say so: a line in text, [] in JSON.
func TestSessionsOrderAndEmpty(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "order-box")
	if got := d.ok(t, "sessions", box); got != "no sessions in sandbox "+box+"\n" {
		t.Errorf("sessions of an empty sandbox: got %q", got)
	}
	if got := d.ok(t, "sessions", box, "--json"); got != "[]\n" {
		t.Errorf("sessions --json of an empty sandbox: got %q", got)
	}
	ids := []string{"zz-first", "aa-second", "mm-third"} // id order is not start order
	for _, id := range ids {
		d.ok(t, "spawn", box, "--id", id, "--", "true") // answers once it runs
		time.Sleep(20 * time.Millisecond)
	}
	var got []string
	for _, s := range decode[[]wire.Session](t, d.ok(t, "sessions", box, "--json")) {
		got = append(got, s.ID)
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("sessions --json order: got %v, want %v (by start)", got, ids)
	}
	got = nil
	for _, line := range strings.Split(strings.TrimSpace(d.ok(t, "sessions", box)), "\n")[1:] {
		got = append(got, strings.Fields(line)[0])
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("sessions table order: got %v, want %v (by start)", got, ids)
	}

	// An empty ls, on a daemon of its own.
	d2, err := startDaemon(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d2.stop)
	if got := d2.ok(t, "ls"); got != "no sandboxes (runner create NAME makes one)\n" {
		t.Errorf("empty ls: got %q", got)
	}
	if got := d2.ok(t, "ls", "--json"); got != "[]\n" {
		t.Errorf("empty ls --json: got %q", got)
	}
}

// TestTail (item 8): logs and attach start at the last --tail N lines of
// each stream, of an ended session and of a running one.
func TestTail(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "tail-box")
	// logs --tail counts lines (issue 25 item 4), of each stream; a last
	// line without a newline counts; attach --tail counts the same way.
	id := strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf 'a\\nb\\nc\\nd'; printf 'e1\\ne2\\n' >&2; exit 3"))
	d.ok(t, "logs", box, id, "-f")
	for _, tt := range []struct {
		args             []string
		wantOut, wantErr string
	}{
		{[]string{"--tail", "2"}, "c\nd", "e1\ne2\n"},
		{[]string{"--tail", "1", "--stream", "stderr"}, "e2\n", ""},
		{[]string{"--tail", "1", "--stream", "stdout"}, "d", ""},
		{[]string{"--tail", "0"}, "", ""},
		{[]string{"--tail", "100"}, "a\nb\nc\nd", "e1\ne2\n"},
		{[]string{"--tail", "2", "-f"}, "c\nd", "e1\ne2\n"},
		{nil, "a\nb\nc\nd", "e1\ne2\n"},
		{[]string{"--stream", "stderr", "--cursor", "3"}, "e2\n", ""},
		{[]string{"--cursor", "6", "--stderr-cursor", "3"}, "d", "e2\n"},
	} {
		out, errOut, code := d.cli(t, nil, append([]string{"logs", box, id}, tt.args...)...)
		if out != tt.wantOut || errOut != tt.wantErr || code != 0 {
			t.Errorf("logs %v: stdout %q stderr %q exit %d; want %q, %q, 0", tt.args, out, errOut, code, tt.wantOut, tt.wantErr)
		}
	}
	for _, tt := range []struct {
		n                string
		wantOut, wantErr string
	}{{"0", "", ""}, {"1", "d", "e2\n"}, {"3", "b\nc\nd", "e1\ne2\n"}, {"9", "a\nb\nc\nd", "e1\ne2\n"}} {
		out, errOut, code := d.cli(t, nil, "attach", box, id, "--tail", tt.n)
		if out != tt.wantOut || errOut != tt.wantErr || code != 3 {
			t.Errorf("attach --tail %s: stdout %q stderr %q exit %d; want %q, %q, 3", tt.n, out, errOut, code, tt.wantOut, tt.wantErr)
		}
	}
	if _, errOut, code := d.cli(t, nil, "attach", box, id, "--tail", "-2"); code != 2 || !strings.Contains(errOut, "want a line count") {
		t.Errorf("attach --tail -2: exit %d stderr %q; want 2, a line count", code, errOut)
	}
	if _, errOut, code := d.cli(t, nil, "logs", box, id, "--tail", "2", "--cursor", "1"); code != 2 || !strings.Contains(errOut, "--tail and --cursor") {
		t.Errorf("logs --tail --cursor: exit %d stderr %q; want 2", code, errOut)
	}
	if _, errOut, code := d.cli(t, nil, "logs", box, id, "--stream", "all"); code != 2 || errOut != "runner logs: --stream \"all\": want both, stdout or stderr (see runner logs --help)\n" {
		t.Errorf("logs --stream all: exit %d stderr %q; want 2", code, errOut)
	}

	// A running session: the tail of what exists, then what follows.
	sb := decode[wire.Sandbox](t, d.ok(t, "get", box, "--json"))
	id = strings.TrimSpace(d.ok(t, "spawn", box, "--", "sh", "-c", "printf '1\\n2\\n3\\n4\\n'; while [ ! -e go ]; do sleep 0.05; done; printf XY"))
	deadline := time.Now().Add(10 * time.Second)
	d.logsUntil(t, deadline, box, id, "1\n2\n3\n4\n", "no output")
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		o, _, code := runCLIEnv(d.env(), nil, "logs", box, id, "--tail", "2", "-f")
		done <- result{string(o), code}
	}()
	time.Sleep(500 * time.Millisecond) // logs has computed its cursor
	if err := os.WriteFile(filepath.Join(sb.WorkspaceOnHost(), "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.out != "3\n4\nXY" || r.code != 0 {
		t.Errorf("logs --tail 2 -f of a running session: got %q exit %d, want 3 4 XY, 0", r.out, r.code)
	}
}
