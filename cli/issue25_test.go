package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
)

// The tests of issue #25's CLI items, each against a real runnerd.

// newTmux starts a tmux server of its own with a shell that finds d, and
// stops it at the end.
func newTmux(t *testing.T, d *daemon) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		testcap.Skip(t, "tmux", "drives runner from a real terminal: "+err.Error())
	}
	x := &tmux{t: t, sock: filepath.Join(t.TempDir(), "sock"), env: cliEnv()}
	shell := fmt.Sprintf("env PATH=%s:/usr/bin:/bin RUNNERD_STATE=%s GORACE=atexit_sleep_ms=0 PS1='host$ ' sh", binDir, d.state)
	x.run("new-session", "-d", "-s", "t", "-x", "120", "-y", "40", shell)
	t.Cleanup(func() {
		cmd := exec.Command("tmux", "-S", x.sock, "kill-server")
		cmd.Env = x.env
		_ = cmd.Run()
	})
	x.waitFor("host$ ")
	return x
}

// TestExecStreamsLiveTmux (item 1): exec prints each line as the command
// writes it. The pane is read at intervals while the command still runs:
// after the first tick and before the last, the pane has the first ticks
// and not the last (a buffered exec showed nothing until the end).
func TestExecStreamsLiveTmux(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "live-box")
	x := newTmux(t, d)
	exitFile := filepath.Join(t.TempDir(), "exit")
	x.line(fmt.Sprintf("runner exec %s -- sh -c 'for i in 1 2 3 4 5; do echo tick-$i; sleep 1; done; exit 3'; echo EXIT=$? > %s", box, exitFile))
	start := time.Now()
	x.waitFor("tick-1")
	if p := x.pane(); strings.Contains(p, "tick-5") {
		t.Fatalf("tick-5 on the pane with tick-1, after %s:\n%s", time.Since(start), p)
	}
	p := x.waitFor("tick-2")
	if _, err := os.Stat(exitFile); strings.Contains(p, "tick-5") || err == nil {
		t.Fatalf("at tick-2 the command had already ended:\n%s", p)
	}
	if got := waitFile(t, exitFile); got != "EXIT=3" {
		t.Errorf("exec: %s, want EXIT=3", got)
	}
	if p := x.pane(); !strings.Contains(p, "tick-1\ntick-2\ntick-3\ntick-4\ntick-5\n") {
		t.Errorf("pane lacks the five ticks in order:\n%s", p)
	}
}

// TestExecOrder (item 1): with 2>&1 (runner's stdout and stderr one
// pipe) the lines come in the order the command wrote them, every time;
// with two pipes each stream keeps its own order.
func TestExecOrder(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "order-box")
	script := "echo 1; echo 2 >&2; echo 3; echo 4 >&2; echo 5; echo 6 >&2; exit 4"
	for i := range 5 {
		cmd := d.command("exec", box, "--", "sh", "-c", script)
		var both bytes.Buffer
		cmd.Stdout, cmd.Stderr = &both, &both // os/exec gives one pipe for both
		_ = cmd.Run()
		if got, want := both.String(), "1\n2\n3\n4\n5\n6\n"; got != want || cmd.ProcessState.ExitCode() != 4 {
			t.Fatalf("run %d, 2>&1: got %q exit %d, want %q exit 4", i, got, cmd.ProcessState.ExitCode(), want)
		}
	}
	out, errOut, code := d.cli(t, nil, "exec", box, "--", "sh", "-c", script)
	if out != "1\n3\n5\n" || errOut != "2\n4\n6\n" || code != 4 {
		t.Errorf("two pipes: stdout %q stderr %q exit %d; want 1 3 5, 2 4 6, exit 4", out, errOut, code)
	}
}

// TestExecNoCut (item 2): 20 MB of output all arrive (the buffered exec
// cut at 16 MiB and exited 0), and the exit code is the command's.
func TestExecNoCut(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "big-box")
	cmd := d.command("exec", box, "--", "sh", "-c", "head -c 20000000 /dev/zero; exit 5")
	var n countWriter
	var errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &n, &errOut
	_ = cmd.Run()
	if n != 20000000 || cmd.ProcessState.ExitCode() != 5 || errOut.Len() != 0 {
		t.Errorf("exec of 20000000 bytes: got %d bytes, exit %d, stderr %q; want all of them, exit 5, no stderr", n, cmd.ProcessState.ExitCode(), errOut.String())
	}
	// Stdin of any size streams too (one exec request held at most
	// about 768 KiB of it).
	in := bytes.Repeat([]byte("x"), 3<<20)
	o, e, code := d.cli(t, in, "exec", box, "-i", "--", "wc", "-c")
	if strings.TrimSpace(o) != fmt.Sprint(len(in)) || code != 0 {
		t.Errorf("exec -i of %d bytes: stdout %q stderr %q exit %d", len(in), o, e, code)
	}
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// TestExecInteractiveTmux (item 3): -it makes the terminal the
// command's (a tty, its size, keys as typed, its exit code); -i alone
// streams stdin as typed (cat answers each line while it runs); run
// creates the sandbox and, with --id, attaches to the same shell again.
func TestExecInteractiveTmux(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "it-box")
	x := newTmux(t, d)
	dir := t.TempDir()

	exit1 := filepath.Join(dir, "exit1")
	x.line(fmt.Sprintf("runner exec -it %s --env 'PS1=in$ ' -- sh; echo EXIT=$? > %s", box, exit1))
	x.waitFor("in$ ")
	x.line("tty; stty size; echo typed-$((6*7))")
	p := x.waitFor("typed-42")
	if !strings.Contains(p, "/dev/pts/") || !strings.Contains(p, "40 120") {
		t.Errorf("exec -it: want a terminal of 40x120:\n%s", p)
	}
	x.line("exit 6")
	if got := waitFile(t, exit1); got != "EXIT=6" {
		t.Errorf("exec -it after exit 6: %s", got)
	}

	// -i: each line reaches cat as typed, and cat's answer comes back
	// while runner still waits; ^D is the EOF.
	exit2 := filepath.Join(dir, "exit2")
	x.run("send-keys", "-t", "t", "clear", "Enter")
	x.line(fmt.Sprintf("runner exec -i %s -- sed -u s/^/got-/; echo EXIT=$? > %s", box, exit2))
	time.Sleep(300 * time.Millisecond)
	x.line("first")
	x.waitFor("got-first")
	x.line("second")
	x.waitFor("got-second")
	if _, err := os.Stat(exit2); err == nil {
		t.Fatal("exec -i ended before its stdin did")
	}
	x.run("send-keys", "-t", "t", "C-d")
	if got := waitFile(t, exit2); got != "EXIT=0" {
		t.Errorf("exec -i after ^D: %s", got)
	}

	// run: create if missing, then attach; the same --id attaches again.
	runBox := "run-box"
	t.Cleanup(func() { runCLIEnv(d.env(), nil, "rm", runBox) })
	exit3, exit4 := filepath.Join(dir, "exit3"), filepath.Join(dir, "exit4")
	x.run("send-keys", "-t", "t", "clear", "Enter")
	x.line(fmt.Sprintf("runner run %s --id sh --env 'PS1=run$ ' -- sh; echo EXIT=$? > %s", runBox, exit3))
	x.waitFor("run$ ")
	x.line("echo first-$((1+1))")
	x.waitFor("first-2")
	x.run("send-keys", "-t", "t", "C-]")
	if got := waitFile(t, exit3); got != fmt.Sprintf("EXIT=%d", exitDetached) {
		t.Errorf("run after the detach key: %s, want EXIT=%d", got, exitDetached)
	}
	x.run("send-keys", "-t", "t", "clear", "Enter")
	x.waitPane("a cleared pane", func(p string) bool { return !strings.Contains(p, "first-2") })
	x.line(fmt.Sprintf("runner run %s --id sh --env 'PS1=run$ ' -- sh; echo EXIT=$? > %s", runBox, exit4))
	x.waitFor("first-2") // the same shell: its output replayed
	x.line("exit 9")
	if got := waitFile(t, exit4); got != "EXIT=9" {
		t.Errorf("second run after exit 9: %s", got)
	}
}

// limitsDaemon is a runnerd that enforces resource limits: root, cgroups
// on, under a cgroup root of its own (absolute, so its directories are
// known and removed at the end).
func limitsDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	testcap.Root(t, "resource limits need root to write cgroups")
	root := fmt.Sprintf("/runner-cli-test-%d", os.Getpid())
	d, err := startDaemonArgs(filepath.Join(binDir, "runnerd"), t.TempDir(), append([]string{"--netpolicy", "off", "--cgroup-root", root}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.stop() // removes the sandboxes, and so their cgroups
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + root)
		for _, dir := range dirs {
			if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove test cgroup root: %v", err)
			}
		}
	})
	if caps := d.ok(t, "caps"); !strings.Contains(caps, "resource_limits\n") {
		testcap.Skip(t, "cgroups", "this host gives runnerd no cgroups with memory, pids and cpu: "+caps)
	}
	return d
}

// TestCreateLimitsAndOOM (items 5 and 6): create takes docker run's limit
// flags and they reach the sandbox as the API's limits; an OOM kill says
// so in text, with the limit; what runnerd refuses is shown with its
// detail and leaves nothing made.
func TestCreateLimitsAndOOM(t *testing.T) {
	d := limitsDaemon(t)
	out := d.ok(t, "create", "hog", "--memory", "32m", "--cpus", "0.5", "--pids", "64")
	if want := "limits: memory 32MiB, cpus 0.5, pids 64\n"; !strings.HasSuffix(out, want) {
		t.Errorf("create with limits: got %q, want it to end %q", out, want)
	}
	sb := decode[wire.Sandbox](t, d.ok(t, "get", "hog", "--json"))
	if l := sb.Limits; l == nil || l.MemoryBytes != 32<<20 || l.CPUQuotaUS != 50000 || l.CPUPeriodUS != 100000 || l.Pids != 64 {
		t.Errorf("limits: got %+v, want memory 32 MiB, quota 50000/100000, pids 64", sb.Limits)
	}
	_, errOut, code := d.cli(t, nil, "exec", "hog", "--", "tail", "/dev/zero")
	if want := "runner: exec hog: killed by the OOM killer (memory limit 32MiB), exit code 137\n"; code != 137 || errOut != want {
		t.Errorf("exec of a memory hog: exit %d stderr %q; want 137, %q", code, errOut, want)
	}
	if out := d.ok(t, "sessions", "hog"); !strings.Contains(out, "137 (SIGKILL), OOM killed") {
		t.Errorf("sessions table does not show the OOM kill:\n%s", out)
	}

	// runnerd refuses a memory limit below 1 MiB: its detail is shown,
	// and nothing is created.
	_, errOut, code = d.cli(t, nil, "create", "tiny", "--memory", "100k")
	if code != exitInvalid || !strings.HasPrefix(errOut, "runner: create tiny: invalid: ") || !strings.Contains(errOut, "memory") {
		t.Errorf("create --memory 100k: exit %d stderr %q; want %d and runnerd's detail", code, errOut, exitInvalid)
	}
	if _, _, code := d.cli(t, nil, "get", "tiny"); code != exitNotFound {
		t.Errorf("after a refused create: get exit %d, want %d", code, exitNotFound)
	}
	// A policy this runnerd does not enforce (--netpolicy off) is refused
	// with its reason, never accepted.
	_, errOut, code = d.cli(t, nil, "create", "net", "--allow", "example.com", "--allow", "pypi.org")
	if code != exitNotSupported || !strings.Contains(errOut, "network policy is not enforced on this host") {
		t.Errorf("create --allow without network_policy: exit %d stderr %q", code, errOut)
	}
	if _, _, code := d.cli(t, nil, "get", "net"); code != exitNotFound {
		t.Errorf("after a refused create: get exit %d, want %d", code, exitNotFound)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"create", "x", "--memory", "12q"}, exitUsage, "runner create: --memory \"12q\": want a size such as 512m or 2g (see runner create --help)\n"},
		{[]string{"create", "x", "--deny-all", "--allow", "a.com"}, exitUsage, "runner create: --deny-all and --allow exclude each other (see runner create --help)\n"},
		{[]string{"create", "x", "--disk", "1q"}, exitUsage, "runner create: --disk \"1q\": want a size such as 10g (see runner create --help)\n"},
		// --disk goes to runnerd as disk_bytes: its refusal, not a guess
		// of runner's, is what the user reads.
		{[]string{"create", "x", "--disk", "1g"}, exitNotSupported, "runner: create x: not_supported: disk_bytes and disk_inodes are not enforced by this runnerd: its storage driver is dir, which bounds no disk (runnerd --storage auto, btrfs or ext4 enforces them; GET /v1/info says storage_driver and disk_budgets)\nrunner: hint: nothing was created; `runner caps` lists what this runnerd enforces (resource_limits for limits, network_policy for --allow/--deny-all)\n"},
	} {
		if _, errOut, code := d.cli(t, nil, tc.args...); code != tc.code || errOut != tc.want {
			t.Errorf("runner %s: exit %d stderr %q; want %d %q", strings.Join(tc.args, " "), code, errOut, tc.code, tc.want)
		}
		if _, _, code := d.cli(t, nil, "get", "x"); code != exitNotFound {
			t.Errorf("after runner %s: get exit %d, want %d (nothing created)", strings.Join(tc.args, " "), code, exitNotFound)
		}
	}
}

// TestUnavailableSaysWhy (item 6): a runnerd that answers 503 is
// running: runner prints its detail and no "is runnerd running?" hint,
// which is kept for a connection nothing accepted.
func TestUnavailableSaysWhy(t *testing.T) {
	d, err := startDaemonArgs(filepath.Join(binDir, "runnerd"), t.TempDir(), "--netpolicy", "off", "--cgroups", "off", "--max-sandboxes", "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	d.ok(t, "create", "one")
	_, errOut, code := d.cli(t, nil, "create", "two")
	if code != exitUnavailable || !strings.HasPrefix(errOut, "runner: create two: unavailable: exhausted: ") || strings.Contains(errOut, "is runnerd running") {
		t.Errorf("create past --max-sandboxes: exit %d stderr %q; want %d, runnerd's detail, no runnerd hint", code, errOut, exitUnavailable)
	}
	_, errOut, _ = d.cli(t, nil, "--json", "create", "two")
	if e := decode[jsonError](t, errOut); e.Error.Kind != "unavailable" || !strings.HasPrefix(e.Error.Detail, "exhausted: ") || e.Error.Hint != "" {
		t.Errorf("--json: got %+v, want unavailable with runnerd's detail and no hint", e.Error)
	}
}

// TestListingsForScripts (item 7): -q and --format on ls, sessions and
// ps; ps spans sandboxes; rm-session -f terminates first; rm -f is
// accepted.
func TestListingsForScripts(t *testing.T) {
	d, err := startDaemon(t.TempDir()) // its own: ls and ps see only this test's sandboxes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	d.ok(t, "create", "lst-a")
	d.ok(t, "create", "lst-b")
	d.ok(t, "spawn", "lst-a", "--id", "run1", "--", "sleep", "60")
	d.ok(t, "spawn", "lst-b", "--id", "run2", "--", "sleep", "60")
	d.ok(t, "exec", "lst-b", "--id", "done1", "--", "true")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ls", "-q"}, "lst-a\nlst-b\n"},
		{[]string{"ls", "--format", "{{.Name}}={{.State}}"}, "lst-a=running\nlst-b=running\n"},
		{[]string{"sessions", "lst-b", "-q"}, "run2\ndone1\n"},
		{[]string{"sessions", "lst-b", "--format", "{{.ID}} {{.State}}"}, "run2 running\ndone1 exited\n"},
		{[]string{"ps", "-q"}, "lst-a run1\nlst-b run2\n"},
		{[]string{"ps", "-a", "-q"}, "lst-a run1\nlst-b run2\nlst-b done1\n"},
		{[]string{"ps", "--format", "{{.Sandbox}}/{{.Session.ID}}"}, "lst-a/run1\nlst-b/run2\n"},
	} {
		if got := d.ok(t, tc.args...); got != tc.want {
			t.Errorf("runner %s: got %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	if out := d.ok(t, "ps"); !strings.HasPrefix(out, "SANDBOX  ID    STATE    EXIT") || !strings.Contains(out, "\nlst-a    run1  running  -") || !strings.Contains(out, "\nlst-b    run2  running  -") {
		t.Errorf("ps table:\n%s", out)
	}
	if _, errOut, code := d.cli(t, nil, "ls", "-q", "--format", "x"); code != exitUsage || errOut != "runner ls: -q and --format exclude each other (see runner ls --help)\n" {
		t.Errorf("ls -q --format: exit %d stderr %q", code, errOut)
	}
	if _, errOut, code := d.cli(t, nil, "ls", "--format", "{{.Nope}}"); code != exitUsage || !strings.Contains(errOut, "Nope") {
		t.Errorf("ls --format with an unknown field: exit %d stderr %q", code, errOut)
	}

	// rm-session refuses a running session; -f terminates it first.
	if _, _, code := d.cli(t, nil, "rm-session", "lst-a", "run1"); code != exitInvalid {
		t.Errorf("rm-session of a running session: exit %d, want %d", code, exitInvalid)
	}
	if out := d.ok(t, "rm-session", "-f", "lst-a", "run1"); out != "removed session run1\n" {
		t.Errorf("rm-session -f: got %q", out)
	}
	if out := d.ok(t, "rm", "-f", "lst-b"); out != "removed lst-b\n" {
		t.Errorf("rm -f: got %q", out)
	}
	if got := d.ok(t, "ps", "-a", "-q"); got != "" {
		t.Errorf("ps -a after the removals: got %q, want nothing", got)
	}
}

// TestCompletion (item 7): the bash script, generated from the command
// table, completes commands, a command's flags and sandbox names; the
// zsh and fish scripts name every command.
func TestCompletion(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "compl-box")
	script := d.ok(t, "completion", "bash")
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"runner", "sessi"}, "sessions"},
		{[]string{"runner", "exec", "--max"}, "--max-time"},
		{[]string{"runner", "--timeout", "5s", "logs", "--tai"}, "--tail"},
		{[]string{"runner", "exec", "compl-b"}, box},
		{[]string{"runner", "exec", box, "compl-b"}, ""}, // the command, not a sandbox
	} {
		words := ""
		for _, w := range tc.words {
			words += fmt.Sprintf(" %q", w)
		}
		prog := script + fmt.Sprintf("\nCOMP_WORDS=(%s); COMP_CWORD=%d; _runner; echo \"${COMPREPLY[*]}\"\n", words, len(tc.words)-1)
		cmd := exec.Command("bash", "-c", prog)
		cmd.Env = append(d.env(), "PATH="+binDir+":/usr/bin:/bin")
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != tc.want {
			t.Errorf("complete %v: got %q (%v), want %q", tc.words, out, err, tc.want)
		}
	}
	for _, shell := range []string{"zsh", "fish"} {
		s := d.ok(t, "completion", shell)
		for _, c := range commands {
			if !strings.Contains(s, c.name) {
				t.Errorf("%s completion lacks %s", shell, c.name)
			}
		}
	}
	if _, errOut, code := d.cli(t, nil, "completion", "tcsh"); code != exitUsage || errOut != "runner completion: shell \"tcsh\": want bash, zsh or fish (see runner completion --help)\n" {
		t.Errorf("completion tcsh: exit %d stderr %q", code, errOut)
	}
}

// TestDetachCodeOnPipes (item 7): detaching is exit 245 on a terminal
// (Ctrl-], TestAttachTmux) and on pipes, where Ctrl-C (SIGINT) is how an
// attach is left: one documented code, and the session keeps running.
func TestDetachCodeOnPipes(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "detach-box")
	d.ok(t, "spawn", box, "--id", "long", "--", "sh", "-c", "echo up; sleep 60")
	cmd := d.command("attach", box, "long")
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for out.String() != "up\n" {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("attach printed %q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitDetached || !strings.Contains(errOut.String(), "runner: detached from "+box+" long; it keeps running.") {
		t.Errorf("attach after SIGINT: exit %d stderr %q; want %d and the detach message", code, errOut.String(), exitDetached)
	}
	if s := decode[wire.Session](t, d.ok(t, "sessions", box, "long", "--json")); s.State != wire.SessionRunning {
		t.Errorf("after the detach: session %s, want running", s.State)
	}
}

// TestInfoCLI (item 9): runner info shows runnerd's view, text and JSON.
func TestInfoCLI(t *testing.T) {
	d, err := startDaemonArgs(filepath.Join(binDir, "runnerd"), t.TempDir(), "--netpolicy", "off", "--cgroups", "off", "--max-sandboxes", "5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	d.ok(t, "create", "info-a")
	d.ok(t, "spawn", "info-a", "--", "sleep", "60")
	in := decode[wire.Info](t, d.ok(t, "info", "--json"))
	if in.StateDir != d.state || in.Capacity.Sandboxes != 1 || in.Capacity.Sessions != 1 || in.Capacity.MaxSandboxes != 5 || in.Cgroups != "off" {
		t.Errorf("info --json: %+v", in)
	}
	out := d.ok(t, "info")
	for _, want := range []string{
		"\nstate:            " + d.state + "\n",
		"\nsandboxes:        1 of at most 5\n",
		"\nsessions:         1 running\n",
		"\ncapabilities:     attach, suspend, terminate_session, tty\n",
		"\ncgroups:          off (resource limits are refused)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("info lacks %q:\n%s", want, out)
		}
	}
}

// TestOneCommitOneVersion (item 8): a binary built as the README says
// (go build, which stamps the checkout's VCS state) and the version
// images/install.sh stamps into runnerd for the same checkout are the same
// string, clean and dirty, so runner version never warns that two builds
// of one commit were built apart. The checkout is a fresh repository
// (go build does not stamp inside a git worktree) holding this tree's
// version package, install.sh and a main that prints version.String(), so
// the build is seconds, not a build of all of runner.
func TestOneCommitOneVersion(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		testcap.Skip(t, "git", "the version comes from a checkout: "+err.Error())
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatal(err)
	}
	src := strings.TrimSpace(string(root))
	repo, bin := t.TempDir(), t.TempDir()
	sh := func(dir, script string) string {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", script, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	sh(src, "tar -cf - go.mod images/install.sh version/version.go | tar -xf - -C "+repo)
	if err := os.MkdirAll(filepath.Join(repo, "cmd", "vprint"), 0o755); err != nil {
		t.Fatal(err)
	}
	main := "package main\n\nimport (\n\t\"fmt\"\n\n\t\"github.com/agentrunner/runner/version\"\n)\n\nfunc main() { fmt.Println(version.String()) }\n"
	if err := os.WriteFile(filepath.Join(repo, "cmd", "vprint", "main.go"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	sh(repo, "git init -q && git add -A && git commit -qm tree")
	rev := sh(repo, "git rev-parse HEAD")[:12]
	for _, tc := range []struct{ state, prepare, want string }{
		{"clean", "true", "dev-" + rev},
		{"dirty", "echo x > untracked-file", "dev-" + rev + "-dirty"},
		{"tagged", "rm untracked-file && git tag v1.2.3", "v1.2.3"},
		{"tagged dirty", "echo '// x' >> version/version.go", "dev-" + rev + "-dirty"},
	} {
		sh(repo, tc.prepare)
		sh(repo, "go build -buildvcs=true -o "+bin+"/ ./cmd/vprint")
		built := sh(bin, "./vprint")
		installed := sh(repo, "images/install.sh --print-version")
		if built != tc.want || installed != tc.want {
			t.Errorf("%s: go build gives %q, install.sh stamps %q; want both %q", tc.state, built, installed, tc.want)
		}
	}
}
