package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
)

// The tests of issue #35's CLI items (2, 3 and 4), each against a real
// runnerd.

// tmpfsDaemon starts a runnerd whose state directory (and so every
// journal) is a tmpfs of size bytes that the test mounts and unmounts:
// a test whose failure fills a disk fills only that.
func tmpfsDaemon(t *testing.T, size string) *daemon {
	t.Helper()
	testcap.Root(t, "mounts a sized tmpfs for the journals")
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		testcap.Skip(t, "root", "mount a tmpfs: "+err.Error())
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount the test tmpfs: %v", err)
		}
	})
	d, err := startDaemon(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	return d
}

// waitBounded waits for cmd, killing it (and failing t) if it still
// runs after 20 s.
func waitBounded(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("runner still ran 20 s after its reader went away")
	}
}

// session reads one session as runner sessions --json shows it.
func (d *daemon) session(t *testing.T, box, id string) wire.Session {
	t.Helper()
	return decode[wire.Session](t, d.ok(t, "sessions", box, id, "--json"))
}

// TestExecBrokenPipe (item 2): `runner exec box -- yes | head -1` ends
// the command: runner exits 141 (as a shell's SIGPIPE death reads), and
// the session has ended within 2 s with a journal far from the disk's
// size. The same for a broken stderr, and for a command that ignores
// SIGPIPE (terminate's SIGTERM ends it). A spawned session that attach
// follows into a broken pipe is left running: attach only watches.
func TestExecBrokenPipe(t *testing.T) {
	d := tmpfsDaemon(t, "256m")
	box := d.sandbox(t, "pipe-box")

	for _, tc := range []struct {
		name   string
		stderr bool // break stderr instead of stdout
		argv   []string
		// most journal bytes: 64 MiB for yes (the bound); a
		// command that ignores SIGPIPE writes on at full speed (500 MB/s
		// into this tmpfs) until terminate ends it 50 ms and two
		// requests later: 10-50 MB here, bounded below the 256 MiB
		// tmpfs that it fills without the fix.
		most int64
	}{
		{"stdout", false, []string{"yes"}, 64 << 20},
		{"stderr", true, []string{"sh", "-c", "yes >&2"}, 64 << 20},
		{"ignores SIGPIPE", false, []string{"sh", "-c", "trap '' PIPE; exec yes"}, 160 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "pipe-" + strings.ReplaceAll(tc.name, " ", "-")
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd := d.command(append([]string{"exec", box, "--id", id, "--"}, tc.argv...)...)
			var other strings.Builder
			if tc.stderr {
				cmd.Stdout, cmd.Stderr = &other, w
			} else {
				cmd.Stdout, cmd.Stderr = w, &other
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			// head -1: read one line, then go away.
			line, err := bufio.NewReader(r).ReadString('\n')
			r.Close()
			closed := time.Now()
			if err != nil || line != "y\n" {
				t.Fatalf("first line: %q, %v; want \"y\\n\"", line, err)
			}
			waitBounded(t, cmd)
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if ws.Signaled() || cmd.ProcessState.ExitCode() != 141 {
				t.Errorf("runner: %v (stderr %q); want exit status 141, not a signal death", cmd.ProcessState, other.String())
			}
			var s wire.Session
			for {
				s = d.session(t, box, id)
				if s.State != wire.SessionRunning || time.Since(closed) > 2*time.Second {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if s.State == wire.SessionRunning {
				t.Errorf("session %s still runs %s after runner's reader went away", id, time.Since(closed).Round(time.Millisecond))
				d.cli(t, nil, "terminate", box, id, "--grace", "100ms")
			}
			total := s.Lengths["stdout"] + s.Lengths["stderr"]
			if total >= tc.most {
				t.Errorf("journal of %s holds %d bytes, want < %d MiB", id, total, tc.most>>20)
			}
			t.Logf("session %s: %s, %d journal bytes", id, s.State, total)
		})
	}

	t.Run("attach leaves the session running", func(t *testing.T) {
		d.ok(t, "spawn", box, "--id", "spawned", "--", "sh", "-c", "yes | head -c 100000000; sleep 60")
		t.Cleanup(func() { d.cli(t, nil, "terminate", box, "spawned", "--grace", "100ms") })
		// attach | head, logs -f | head: exit 141, the session untouched.
		for _, args := range [][]string{{"attach", box, "spawned"}, {"logs", box, "spawned", "-f"}, {"logs", box, "spawned", "--stream", "stdout", "-f"}} {
			headOne(t, d, args...)
		}
		time.Sleep(300 * time.Millisecond)
		if s := d.session(t, box, "spawned"); s.State != wire.SessionRunning {
			t.Errorf("spawned session after attach's broken pipe: %s, want running", s.State)
		}
	})
}

// TestEnvSecretsOutOfArgv (item 3): --env KEY takes the value from
// runner's own environment and --env-file from a file, and neither puts
// it in runner's argv: another sandbox reading runner's
// /proc/PID/cmdline while the command runs sees the command line, never
// the value. The command itself gets it. write --file sends a file's
// bytes as write - does.
func TestEnvSecretsOutOfArgv(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "secret-box")
	spy := d.sandbox(t, "spy-box")
	secret := fmt.Sprintf("hunter2-%d", time.Now().UnixNano())
	envFile := writeFile(t, "# deploy keys\n\nFROM_FILE="+secret+"-file\n  FROM_ENV\n")

	for _, tc := range []struct {
		name  string
		flags []string
		want  string // what the command prints
	}{
		{"env KEY", []string{"--env", "API_KEY"}, "API_KEY=" + secret + "\n"},
		{"env-file", []string{"--env-file", envFile}, "FROM_FILE=" + secret + "-file\nFROM_ENV=" + secret + "-env\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"exec", box}, tc.flags...), "--", "sh", "-c",
				`env | grep -E '^(API_KEY|FROM_FILE|FROM_ENV)=' | sort -r; echo started >&2; sleep 30`)
			cmd := exec.Command(filepath.Join(binDir, "runner"), args...)
			cmd.Env = append(d.env(), "API_KEY="+secret, "FROM_ENV="+secret+"-env")
			var out syncBuffer
			cmd.Stdout = &out
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = w
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGINT) // forwarded: the command ends
				_ = cmd.Process.Signal(syscall.SIGINT)
				waitBounded(t, cmd)
			}()
			line, err := bufio.NewReader(r).ReadString('\n')
			if err != nil || line != "started\n" {
				t.Fatalf("exec: stderr %q, %v; want \"started\\n\"", line, err)
			}
			seen, errOut, code := d.cli(t, nil, "exec", spy, "--", "sh", "-c",
				fmt.Sprintf("tr '\\0' ' ' < /proc/%d/cmdline; echo; ps -eo args", cmd.Process.Pid))
			if code != 0 {
				t.Fatalf("spy: exit %d: %s", code, errOut)
			}
			// Any local user reads runner's argv (ps); a sandbox that is
			// not a pod does too, a pod sees no host process at all.
			hostView, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			host := strings.ReplaceAll(string(hostView), "\x00", " ")
			if want := strings.Join(args[:len(args)-1], " "); !strings.Contains(host, want) {
				t.Fatalf("the host does not see runner's command line %q (so it proves nothing):\n%s", want, host)
			}
			if strings.Contains(host, secret) {
				t.Errorf("runner's argv holds the secret:\n%s", host)
			}
			if strings.Contains(seen, secret) {
				t.Errorf("another sandbox reads the secret in runner's argv:\n%s", seen)
			}
			time.Sleep(100 * time.Millisecond)
			if got := out.String(); got != tc.want {
				t.Errorf("the command's environment: got %q, want %q", got, tc.want)
			}
		})
	}

	// A KEY runner does not have is refused, not sent empty.
	_, errOut, code := d.cli(t, nil, "exec", box, "--env", "NOT_SET_ANYWHERE", "--", "true")
	if want := "runner exec: --env: NOT_SET_ANYWHERE is not set in runner's environment (--env KEY takes the value from there) (see runner exec --help)\n"; code != exitUsage || errOut != want {
		t.Errorf("--env of an unset KEY: exit %d stderr %q; want %d %q", code, errOut, exitUsage, want)
	}
	// A malformed line is named by its number, never quoted.
	bad := writeFile(t, "OK=1\n="+secret+"\n")
	_, errOut, code = d.cli(t, nil, "spawn", box, "--env-file", bad, "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "line 2") || strings.Contains(errOut, secret) {
		t.Errorf("--env-file with a bad line: exit %d stderr %q; want %d, line 2, no value", code, errOut, exitUsage)
	}

	d.ok(t, "spawn", box, "--id", "reader", "--", "sh", "-c", "read x; echo got-$x")
	d.ok(t, "write", box, "reader", "--file", writeFile(t, secret+"\n"))
	if out := d.ok(t, "logs", box, "reader", "-f"); out != "got-"+secret+"\n" {
		t.Errorf("after write --file: logs %q, want %q", out, "got-"+secret+"\n")
	}
}

// TestConflictHints (item 4): each 409 gets the hint of its own reason
// (wire.Error.Reason): a suspended sandbox says resume, a reused session
// id names what differs, a create that conflicts names runner commands,
// never an API path.
func TestConflictHints(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "lim")
	d.ok(t, "suspend", box)
	_, errOut, code := d.cli(t, nil, "exec", box, "--id", "myid", "--", "true")
	if want := "runner: exec lim: invalid: sandbox suspended\nrunner: hint: sandbox lim is suspended: runner resume lim, then run the command again\n"; code != exitInvalid || errOut != want {
		t.Errorf("exec in a suspended sandbox: exit %d stderr %q; want %d %q", code, errOut, exitInvalid, want)
	}
	_, errOut, _ = d.cli(t, nil, "--json", "spawn", box, "--", "true")
	if e := decode[jsonError](t, errOut); e.Error.Kind != "invalid" || !strings.Contains(e.Error.Hint, "runner resume lim") {
		t.Errorf("spawn --json in a suspended sandbox: %+v, want invalid with the resume hint", e.Error)
	}
	d.ok(t, "resume", box)

	d.ok(t, "spawn", box, "--id", "myid", "--", "sleep", "30")
	t.Cleanup(func() { d.cli(t, nil, "terminate", box, "myid", "--grace", "100ms") })
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", box, "--id", "myid", "--", "sleep", "31"},
			"runner: hint: session myid exists with another command (it runs sleep 30, this asks sleep 31): runner attach lim myid, or pick another --id\n"},
		{[]string{"exec", box, "-t", "--id", "myid", "--", "sleep", "30"},
			"runner: hint: session myid exists with pipes (it was started without a TTY, this asks for one: -t=false): runner attach lim myid, or pick another --id\n"},
		{[]string{"spawn", box, "--id", "myid", "--env", "A=1", "--", "sleep", "30"},
			"runner: hint: session myid exists with the same command but another environment, working directory, terminal size or stdout/stderr merge: runner attach lim myid, or pick another --id\n"},
	} {
		_, errOut, code := d.cli(t, nil, tc.args...)
		if code != exitInvalid || !strings.HasSuffix(errOut, tc.want) {
			t.Errorf("runner %s: exit %d stderr %q; want %d, ending %q", strings.Join(tc.args, " "), code, errOut, exitInvalid, tc.want)
		}
	}

	// The reason is on the wire for every client.
	req, _ := http.NewRequest(http.MethodPost, "http://"+d.addr+"/v1/sandboxes/lim/sessions", strings.NewReader(`{"id":"myid","argv":["sleep","31"]}`))
	tok, err := os.ReadFile(filepath.Join(d.state, "token"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body wire.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 409 || body.Error.Reason != wire.ReasonSessionExists {
		t.Errorf("POST sessions with a reused id: %d %+v (%v); want 409 reason %s", resp.StatusCode, body.Error, err, wire.ReasonSessionExists)
	}
}

// TestRmAbsent (item 4): rm of a name that does not exist says so and
// exits 253 (not_found), as rm does; with -f it is no error, as rm -f.
// What exists is removed either way.
func TestRmAbsent(t *testing.T) {
	d := sharedDaemon(t)
	d.ok(t, "create", "rm-real")
	out, errOut, code := d.cli(t, nil, "rm", "rm-typo", "rm-real")
	if code != exitNotFound || out != "removed rm-real\n" || errOut != "runner: rm rm-typo: no such sandbox\n" {
		t.Errorf("rm of a typo: exit %d stdout %q stderr %q; want %d, \"removed rm-real\", \"no such sandbox\"", code, out, errOut, exitNotFound)
	}
	out, errOut, code = d.cli(t, nil, "rm", "-f", "rm-typo")
	if code != 0 || out != "" || errOut != "runner: rm rm-typo: no such sandbox\n" {
		t.Errorf("rm -f of a typo: exit %d stdout %q stderr %q; want 0 and \"no such sandbox\"", code, out, errOut)
	}
	out, _, code = d.cli(t, nil, "--json", "rm", "-f", "rm-typo")
	if want := "{\n  \"removed\": [],\n  \"absent\": [\n    \"rm-typo\"\n  ]\n}\n"; code != 0 || out != want {
		t.Errorf("rm -f --json of a typo: exit %d %q, want 0 %q", code, out, want)
	}
}

// TestPolicyShow (item 4): policy NAME with no hosts prints the policy
// and changes nothing; denying all egress is --deny-all.
func TestPolicyShow(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "pol-box")
	out, errOut, code := d.cli(t, nil, "policy", box)
	if code != 0 || out != "pol-box: unrestricted (no policy)\n" {
		t.Errorf("policy with no hosts: exit %d stdout %q stderr %q; want 0 \"pol-box: unrestricted (no policy)\"", code, out, errOut)
	}
	if sb := decode[wire.Sandbox](t, d.ok(t, "get", box, "--json")); sb.Network != nil {
		t.Errorf("after policy with no hosts: network %+v, want none (unchanged)", sb.Network)
	}
	// This daemon runs --netpolicy off: --deny-all asks, and is refused.
	if _, errOut, code := d.cli(t, nil, "policy", box, "--deny-all"); code != exitNotSupported {
		t.Errorf("policy --deny-all without network_policy: exit %d stderr %q, want %d", code, errOut, exitNotSupported)
	}
	if _, errOut, code := d.cli(t, nil, "policy", box, "--deny-all", "a.com"); code != exitUsage {
		t.Errorf("policy --deny-all a.com: exit %d stderr %q, want %d", code, errOut, exitUsage)
	}
}

// TestNonRootHint (item 4): a runner that is not root, against a root
// runnerd whose state it cannot read, is told to use sudo, not asked
// whether runnerd runs.
func TestNonRootHint(t *testing.T) {
	d := sharedDaemon(t)
	testcap.Root(t, "runs runner as another user against a root runnerd")
	dir, err := os.MkdirTemp("", "runner-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := os.ReadFile(filepath.Join(binDir, "runner"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "runner")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "ls")
	cmd.Env = d.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	_ = cmd.Run()
	want := "runner: hint: runnerd runs as root and its state (" + d.state + ") is root's: use sudo (sudo runner ...), or --token-file with a copy of its token\n"
	if code := cmd.ProcessState.ExitCode(); code != exitDenied || !strings.HasSuffix(stderr.String(), want) || strings.Contains(stderr.String(), "is runnerd running") {
		t.Errorf("runner ls as uid 65534: exit %d stderr %q; want %d, ending %q", code, stderr.String(), exitDenied, want)
	}
}

// TestRunnerdStderrPipeClosed (item 4): `runnerd 2>&1 | tee log` and
// Ctrl-C ends tee too; runnerd's next log line then goes into a closed
// pipe. It finishes its stop all the same: exit 0, its socket and
// listen.json removed.
func TestRunnerdStderrPipeClosed(t *testing.T) {
	state := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "runnerd"), "--state", state, "--listen", "127.0.0.1:0", "--netpolicy", "off", "--cgroups", "off")
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN=")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("runnerd's log ended before it served: %v", err)
		}
		if strings.Contains(line, "runnerd serving") {
			break
		}
	}
	r.Close() // tee is gone
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitBounded(t, cmd)
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() || ws.ExitStatus() != 0 {
		t.Errorf("runnerd after Ctrl-C with its stderr pipe closed: %v, want exit status 0", cmd.ProcessState)
	}
	for _, f := range []string{"runnerd.sock", wire.ListenFile} {
		if _, err := os.Stat(filepath.Join(state, f)); !os.IsNotExist(err) {
			t.Errorf("after the stop: %s is still there (%v)", f, err)
		}
	}
}

// TestExecLang (item 4): a command's environment has LANG=C.UTF-8 where
// the host has that locale (this one has), so UTF-8 is not the C
// locale's '?'; a LANG the caller sends wins.
func TestExecLang(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "lang-box")
	want := "\n"
	for _, dir := range []string{"/usr/lib/locale/C.utf8", "/usr/lib/locale/C.UTF-8"} {
		if _, err := os.Stat(dir); err == nil {
			want = "C.UTF-8\n"
		}
	}
	if want == "\n" {
		t.Logf("this host has no C.UTF-8 locale: LANG must stay unset")
	}
	if out := d.ok(t, "exec", box, "--", "sh", "-c", "echo $LANG"); out != want {
		t.Errorf("LANG: got %q, want %q", out, want)
	}
	if out := d.ok(t, "exec", box, "--env", "LANG=fr_FR.UTF-8", "--", "sh", "-c", "echo $LANG"); out != "fr_FR.UTF-8\n" {
		t.Errorf("LANG sent by the caller: got %q, want %q", out, "fr_FR.UTF-8\n")
	}
}

// TestStartingNotStopped (item 4): while runnerd starts (here its shim
// check takes 3 s), runner says it is starting, not "is runnerd
// running?"; once it serves, runner works and the starting file is
// gone. A starting file naming no process (a start that died) is not
// starting.
func TestStartingNotStopped(t *testing.T) {
	state := t.TempDir()
	shim := filepath.Join(t.TempDir(), "slow-shim")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = --version ]; then sleep 3; fi\nexec %s shim \"$@\"\n", filepath.Join(binDir, "runnerd"))
	if err := os.WriteFile(shim, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &daemon{state: state}
	cmd := exec.Command(filepath.Join(binDir, "runnerd"), "--state", state, "--listen", "127.0.0.1:0", "--netpolicy", "off", "--cgroups", "off", "--shim", shim)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN=")
	log := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		waitBounded(t, cmd)
	})
	startingFile := filepath.Join(state, wire.StartingFile)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(startingFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s while runnerd starts; log:\n%s", wire.StartingFile, log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, errOut, code := d.cli(t, nil, "ls")
	want := fmt.Sprintf("runner: hint: runnerd (pid %d) is starting: it serves once it has recovered its sandboxes and sessions; retry in a moment\n", cmd.Process.Pid)
	if code != exitUnavailable || !strings.HasSuffix(errOut, want) || strings.Contains(errOut, "is runnerd running") {
		t.Errorf("ls while runnerd starts: exit %d stderr %q; want %d, ending %q", code, errOut, exitUnavailable, want)
	}
	for !strings.Contains(log.String(), "runnerd serving") {
		if time.Now().After(deadline) {
			t.Fatalf("runnerd did not serve; log:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, errOut, code := d.cli(t, nil, "ls"); code != 0 {
		t.Errorf("ls once runnerd serves: exit %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(startingFile); !os.IsNotExist(err) {
		t.Errorf("%s still there once runnerd serves (%v)", wire.StartingFile, err)
	}

	// A start that died: the file names no process.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, wire.StartingFile), fmt.Appendf(nil, `{"pid":%d}`, dead.Process.Pid), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, _ = (&daemon{state: other}).cli(t, nil, "ls")
	if strings.Contains(errOut, "is starting") {
		t.Errorf("ls with a stale starting file: %q, want no \"is starting\"", errOut)
	}
}

// TestStartupLogCgroupRoot (item 4): the line that says runnerd serves
// names the cgroup root it uses (and "off" without cgroups).
func TestStartupLogCgroupRoot(t *testing.T) {
	d := limitsDaemon(t)
	want := fmt.Sprintf(" cgroup_root=/runner-cli-test-%d", os.Getpid())
	serving := ""
	for _, line := range strings.Split(d.log.String(), "\n") {
		if strings.Contains(line, "runnerd serving") {
			serving = line
		}
	}
	if !strings.Contains(serving, want) || !strings.Contains(serving, " cgroups=v") {
		t.Errorf("serving line %q: want %q and the cgroup mode", serving, want)
	}
	if off := sharedDaemon(t).log.String(); !strings.Contains(off, "cgroups=off cgroup_root=\"\"") {
		t.Errorf("a runnerd with --cgroups off: its log does not say cgroups=off:\n%s", off)
	}
}

// TestRunIDAfterEnd (item 4): run --id X, as tmux new -A, starts X
// afresh once X has ended (saying so) instead of replaying it, and
// rejoins a running spawn --tty session of the same command instead of
// refusing it for its terminal.
func TestRunIDAfterEnd(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "rerun-box")
	count := []string{"run", box, "--id", "counter", "-i=false", "--", "sh", "-c", "echo x >> count; n=$(wc -l < count); echo run-$n; exit $n"}
	if out, errOut, code := d.cli(t, nil, count...); out != "run-1\n" || code != 1 {
		t.Fatalf("first run: %q exit %d (%s), want run-1 exit 1", out, code, errOut)
	}
	out, errOut, code := d.cli(t, nil, count...)
	if out != "run-2\n" || code != 2 || errOut != "runner: session counter ended (exit code 1); starting it again (its output is replaced)\n" {
		t.Errorf("run --id after the end: %q exit %d stderr %q; want run-2 exit 2 and the notice", out, code, errOut)
	}

	argv := []string{"sh", "-c", "read line; echo got-$line; exit 4"}
	d.ok(t, append([]string{"spawn", box, "--tty", "--id", "shell", "--"}, argv...)...)
	t.Cleanup(func() { d.cli(t, nil, "terminate", box, "shell", "--grace", "100ms") })
	out, errOut, code = d.cli(t, []byte("hello\n"), append([]string{"run", box, "--id", "shell", "--"}, argv...)...)
	if code != 4 || !strings.Contains(out, "got-hello") {
		t.Errorf("run --id of a running spawn --tty session: %q exit %d stderr %q; want got-hello, exit 4", out, code, errOut)
	}
}

// TestSmallHints (item 4): a mistyped flag gets a "did you mean"; a
// custom --detach-key is kept in the reattach hint; get shows the uid
// and the isolation; bash completion skips the value of --ca, --cert
// and --key.
func TestSmallHints(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "hint-box")
	_, errOut, code := d.cli(t, nil, "exec", box, "--detach-ky", "ctrl-x", "--", "true")
	if want := "runner exec: flag provided but not defined: -detach-ky; did you mean --detach-key? (see runner exec --help)\n"; code != exitUsage || errOut != want {
		t.Errorf("a mistyped flag: exit %d stderr %q; want %d %q", code, errOut, exitUsage, want)
	}
	if _, errOut, _ := d.cli(t, nil, "exec", box, "-it", "--zzzz", "--", "true"); strings.Contains(errOut, "did you mean") {
		t.Errorf("a flag near nothing: %q, want no suggestion", errOut)
	}

	d.ok(t, "spawn", box, "--id", "long", "--", "sh", "-c", "echo up; sleep 60")
	t.Cleanup(func() { d.cli(t, nil, "terminate", box, "long", "--grace", "100ms") })
	cmd := d.command("attach", box, "long", "--detach-key", "ctrl-x")
	var out, errBuf syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errBuf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); out.String() != "up\n"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("attach printed %q", out.String())
		}
	}
	_ = cmd.Process.Signal(os.Interrupt)
	waitBounded(t, cmd)
	if want := "reattach with: runner attach " + box + " long --cursor 3 --detach-key ctrl-x\n"; !strings.Contains(errBuf.String(), want) {
		t.Errorf("detach with --detach-key ctrl-x: stderr %q, want %q", errBuf.String(), want)
	}

	get := d.ok(t, "get", box)
	sb := decode[wire.Sandbox](t, d.ok(t, "get", box, "--json"))
	if sb.UID == nil || !sb.Isolated {
		t.Fatalf("the shared runnerd (root) gave %s no uid of its own: %+v", box, sb)
	}
	for _, want := range []string{fmt.Sprintf("runs as:     uid %d, gid %d\n", *sb.UID, *sb.GID), "isolation:   isolated (an unprivileged uid of its own, no_new_privs, no capabilities)\n"} {
		if !strings.Contains(get, want) {
			t.Errorf("get: %q lacks %q", get, want)
		}
	}

	bash := d.ok(t, "completion", "bash")
	if !strings.Contains(bash, "--ca|-ca|--cert|-cert|--key|-key") {
		t.Errorf("bash completion does not skip the value of --ca, --cert, --key:\n%s", bash)
	}
}

// TestLimitsDisplay (item 4): with cgroups, get shows the sandbox's
// usage, checkpoints sizes are human units, and a refused limit says
// invalid once.
func TestLimitsDisplay(t *testing.T) {
	d := limitsDaemon(t)
	d.ok(t, "create", "usage-box", "--memory", "64m")
	d.ok(t, "exec", "usage-box", "--", "sh", "-c", "head -c 3000000 /dev/urandom > blob")
	if get := d.ok(t, "get", "usage-box"); !strings.Contains(get, "usage:       memory ") || !strings.Contains(get, "oom kills 0\n") {
		t.Errorf("get with cgroups shows no usage:\n%s", get)
	}
	_, errOut, _ := d.cli(t, nil, "create", "tiny", "--memory", "100k")
	if want := "runner: create tiny: invalid: limits: memory 102400: below the minimum 1048576 bytes\n"; errOut != want {
		t.Errorf("refused limit: %q, want %q (invalid once)", errOut, want)
	}
	if caps := d.ok(t, "caps"); !strings.Contains(caps, "checkpoint") {
		t.Logf("no checkpoints on this runnerd: %q", caps)
		return
	}
	d.ok(t, "checkpoint", "usage-box", "-m", "blob")
	list := d.ok(t, "checkpoints", "usage-box")
	if !regexp.MustCompile(`\t?\s2\.86[0-9]*MiB\s+2\.8[0-9]*MiB\s+blob\n`).MatchString(list) {
		t.Errorf("checkpoints: sizes not in human units:\n%s", list)
	}
}

// TestLimitsCommand (item 4): a create that conflicts with a sandbox's
// limits or policy points to runner's commands, never to PUT /v1/...;
// runner limits shows and changes limits, keeping those not named;
// runnerd's defaults (here pids 512, memory 128 MiB) fill what a sandbox
// does not name, and --none goes back to them.
func TestLimitsCommand(t *testing.T) {
	d := limitsDaemon(t, "--default-pids", "512", "--default-memory", "128m")
	d.ok(t, "create", "lim-box", "--memory", "64m")
	_, errOut, code := d.cli(t, nil, "create", "lim-box", "--memory", "32m")
	want := "runner: create lim-box: invalid: conflict: sandbox \"lim-box\" exists with different limits\n" +
		"runner: hint: sandbox lim-box exists with other settings: runner get lim-box shows them; runner policy lim-box HOST... (or --deny-all) changes its network policy, runner limits lim-box --memory ... its limits; or create another NAME\n"
	if code != exitInvalid || errOut != want {
		t.Errorf("create with other limits: exit %d stderr %q; want %d %q", code, errOut, exitInvalid, want)
	}
	if out := d.ok(t, "limits", "lim-box"); out != "lim-box: memory 64MiB, pids 512\n" {
		t.Errorf("limits: %q, want \"lim-box: memory 64MiB, pids 512\"", out)
	}
	if out := d.ok(t, "limits", "lim-box", "--pids", "100"); out != "lim-box: memory 64MiB, pids 100\n" {
		t.Errorf("limits --pids 100: %q, want memory kept and pids 100", out)
	}
	if sb := decode[wire.Sandbox](t, d.ok(t, "get", "lim-box", "--json")); sb.Limits == nil || sb.Limits.Pids != 100 || sb.Limits.MemoryBytes != 64<<20 {
		t.Errorf("after limits --pids 100: %+v", sb.Limits)
	}
	if out := d.ok(t, "limits", "lim-box", "--none"); out != "lim-box: memory 128MiB, pids 512\n" {
		t.Errorf("limits --none: %q, want runnerd's defaults \"lim-box: memory 128MiB, pids 512\"", out)
	}
}

// TestStdinKeptAcrossRestart (item 4): input runner reads while runnerd
// restarts is kept and delivered once runnerd serves again, in order,
// each byte once; runner says so rather than "input did not reach the
// session".
func TestStdinKeptAcrossRestart(t *testing.T) {
	d, state := ownDaemon(t)
	d.ok(t, "create", "keep-box")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cmd, out, errOut := d.startFed(t, r, "exec", "keep-box", "-i", "--", "sh", "-c", "while read l; do echo got-$l; done; echo eof")
	waitOut := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); out.String() != want; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("stdout %q, want %q; stderr %q", out.String(), want, errOut.String())
			}
		}
	}
	fmt.Fprintln(w, "a")
	waitOut("got-a\n")

	// runnerd stops (its sessions run on); input arrives meanwhile.
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
	fmt.Fprintln(w, "b")
	fmt.Fprintln(w, "c")
	time.Sleep(500 * time.Millisecond)
	d2, err := startDaemon(state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d2.stop)
	waitOut("got-a\ngot-b\ngot-c\n")
	fmt.Fprintln(w, "d")
	w.Close()
	waitBounded(t, cmd)
	if got, want := out.String(), "got-a\ngot-b\ngot-c\ngot-d\neof\n"; got != want || cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("exec -i across a restart: stdout %q exit %d, want %q exit 0; stderr %q", got, cmd.ProcessState.ExitCode(), want, errOut.String())
	}
	if e := errOut.String(); strings.Contains(e, "did not reach") || !strings.Contains(e, "input is kept and sent once it is back") {
		t.Errorf("stderr %q: want the kept-input notice, not \"did not reach\"", e)
	}
}

// headOne runs runner with args into a pipe whose reader, like head -1,
// goes away after the first line, and wants runner to exit 141 (not die
// of the signal) within waitBounded's bound.
func headOne(t *testing.T, d *daemon, args ...string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "runner"), args...)
	cmd.Env, cmd.Stdout = d.env(), w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := bufio.NewReader(r).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	r.Close()
	waitBounded(t, cmd)
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() || cmd.ProcessState.ExitCode() != 141 {
		t.Errorf("runner %s | head: %v; want exit status 141", strings.Join(args, " "), cmd.ProcessState)
	}
}
