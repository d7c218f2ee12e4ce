package e2b_test

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/e2b"
	"github.com/agentrunner/runner/adapter/e2b/e2btest"
)

// These pin the stand-in to what envd 0.6.13 does (issue #22, measured
// against envd built from e2b-dev/infra), through the client: where the
// stand-in and envd differ, a client that is right for one is wrong for
// the other. Each check runs against a target: the stand-in here, a real
// envd in TestRealEnvd (realenvd_test.go) when one is given.

// envdTarget is an envd to check.
type envdTarget struct {
	// as returns an envd client that names user in HTTP Basic ("": none).
	as func(t *testing.T, user string) *e2b.Envd
	// home is the default working directory (/home/user on E2B).
	home string
	// tag is a variable the target adds to every environment ("": none).
	tag string
	// switches is whether the target runs processes as the user's uid
	// (the stand-in does only as root).
	switches bool
	// inVM is envd's E2B_SANDBOX: "true" in a Firecracker VM, "false"
	// for an envd run with -isnotfc.
	inVM string
}

// standInTarget is the stand-in as an envdTarget.
func standInTarget(t *testing.T) envdTarget {
	s := newSandbox(t, e2btest.Options{})
	return envdTarget{
		as: func(t *testing.T, user string) *e2b.Envd {
			if user == "" {
				return s.envd
			}
			c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret(s.srv.APIKey), APIURL: s.srv.URL(), SandboxURL: s.srv.SandboxURL(), User: user})
			if err != nil {
				t.Fatal(err)
			}
			return c.Envd(s.sb)
		},
		home:     s.dir,
		tag:      e2btest.TagEnv,
		inVM:     "true",
		switches: os.Geteuid() == 0,
	}
}

// envdChecks are the points issue #22 lists, each a check of one target.
var envdChecks = []struct {
	name  string
	check func(t *testing.T, x envdTarget)
}{
	{"UserAndEnvironment", checkUserAndEnvironment},
	{"Cwd", checkCwd},
	{"MissingProgramAndCwd", checkMissingProgramAndCwd},
	{"EndErrors", checkEndErrors},
	{"LifetimeKillsOnlyThePID", checkLifetimeKillsOnlyThePID},
	{"CloseStdinAnswers", checkCloseStdinAnswers},
	{"ConnectToEnded", checkConnectToEnded},
	{"FilesAnswers", checkFilesAnswers},
}

// TestEnvdFidelity runs every check against the stand-in.
func TestEnvdFidelity(t *testing.T) {
	for _, c := range envdChecks {
		t.Run(c.name, func(t *testing.T) { c.check(t, standInTarget(t)) })
	}
}

// envOf runs req and returns the variables env printed, by name.
func envOf(t *testing.T, envd *e2b.Envd, req e2b.StartRequest) map[string]string {
	t.Helper()
	out := run(t, envd, req)
	if out.End.ExitCode != 0 {
		t.Fatalf("env: %+v", out)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(string(out.Stdout), "\n"), "\n") {
		k, v, _ := strings.Cut(l, "=")
		m[k] = v
	}
	return m
}

func run(t *testing.T, envd *e2b.Envd, req e2b.StartRequest) e2b.Output {
	t.Helper()
	st, err := envd.Start(ctxFor(t), req)
	if err != nil {
		t.Fatalf("start %s: %v", req.Process.Cmd, err)
	}
	out, err := st.Drain()
	if err != nil {
		t.Fatalf("drain %s: %v", req.Process.Cmd, err)
	}
	return out
}

// checkUserAndEnvironment: envd runs processes as /init's default user
// ("user") or the HTTP Basic user ("root"), in a clean environment: its
// PATH, the user's HOME, USER and LOGNAME, then the request's variables
// (which win); an unknown user is unauthenticated.
func checkUserAndEnvironment(t *testing.T, x envdTarget) {
	req := argv("env")
	req.Process.Envs = map[string]string{"ASKED": "1", "LOGNAME": "overridden"}
	got := envOf(t, x.as(t, ""), req)
	want := map[string]string{"PATH": os.Getenv("PATH"), "HOME": "/home/user", "USER": "user", "LOGNAME": "overridden", "ASKED": "1",
		"E2B_SANDBOX": x.inVM}
	names := func(m map[string]string) []string {
		var ks []string
		for k := range m {
			if k != x.tag && k != "PWD" { // the target's tag; sh's PWD
				ks = append(ks, k)
			}
		}
		slices.Sort(ks)
		return ks
	}
	if !slices.Equal(names(got), names(want)) {
		t.Fatalf("environment names %v, want %v (a clean one)", names(got), names(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if root := envOf(t, x.as(t, "root"), argv("env")); root["USER"] != "root" || root["HOME"] != "/root" {
		t.Errorf("as root: USER=%q HOME=%q, want root and /root", root["USER"], root["HOME"])
	}
	if x.switches {
		for user, want := range map[string]string{"": "2001 2001\n", "root": "0 0\n"} {
			if out := run(t, x.as(t, user), sh("echo $(id -u) $(id -g)")); string(out.Stdout) != want {
				t.Errorf("uid and gid as %q: %q, want %q", user, out.Stdout, want)
			}
		}
	}
	_, err := x.as(t, "nobody-here").Start(ctxFor(t), argv("true"))
	var e *e2b.Error
	if !errors.As(err, &e) || e.Code != e2b.CodeUnauthenticated || !errors.Is(err, adapter.ErrDenied) {
		t.Errorf("start as an unknown user: %v, want unauthenticated (denied)", err)
	}
	_, err = x.as(t, "nobody-here").List(ctxFor(t))
	if !errors.As(err, &e) || e.Code != e2b.CodeUnauthenticated || e.Status != 401 {
		t.Errorf("list as an unknown user: %v, want a 401 unauthenticated", err)
	}
}

// checkCwd: the default working directory is the user's workdir.
func checkCwd(t *testing.T, x envdTarget) {
	if out := run(t, x.as(t, ""), argv("pwd")); string(out.Stdout) != x.home+"\n" {
		t.Errorf("pwd: %q, want %q", out.Stdout, x.home)
	}
}

// checkMissingProgramAndCwd: envd's /bin/sh wrapper starts, then finds
// no program: exit 127. A missing cwd is invalid_argument before any
// start event.
func checkMissingProgramAndCwd(t *testing.T, x envdTarget) {
	if out := run(t, x.as(t, ""), argv("/no/such/program")); out.End.ExitCode != 127 || !out.End.Exited || out.End.Error != "exit status 127" {
		t.Errorf("start of a missing program: got %+v; want a start event, then exit 127", out)
	}
	missing := argv("true")
	missing.Process.Cwd = "/no/such/dir"
	_, err := x.as(t, "").Start(ctxFor(t), missing)
	wantKind(t, "start in a missing cwd", err, adapter.KindInvalid)
}

// checkEndErrors: end events carry cmd.Wait's error text.
func checkEndErrors(t *testing.T, x envdTarget) {
	for _, tc := range []struct {
		script string
		want   e2b.EndEvent
	}{
		{"exit 0", e2b.EndEvent{ExitCode: 0, Exited: true, Status: "exit status 0"}},
		{"exit 3", e2b.EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3", Error: "exit status 3"}},
		{"kill -9 $$", e2b.EndEvent{ExitCode: -1, Exited: false, Status: "signal: killed", Error: "signal: killed"}},
		{"kill -TERM $$", e2b.EndEvent{ExitCode: -1, Exited: false, Status: "signal: terminated", Error: "signal: terminated"}},
	} {
		if out := run(t, x.as(t, ""), sh(tc.script)); out.End != tc.want {
			t.Errorf("%s: end %+v, want %+v", tc.script, out.End, tc.want)
		}
	}
}

// checkLifetimeKillsOnlyThePID: Connect-Timeout-Ms ends the process envd
// started (exec.CommandContext kills its pid), not its group: a child it
// left behind lives on.
func checkLifetimeKillsOnlyThePID(t *testing.T, x envdTarget) {
	envd := x.as(t, "")
	req := sh(`sleep 60 & echo $!; wait`)
	req.Lifetime = 500 * time.Millisecond
	st, err := envd.Start(ctxFor(t), req)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(ev.Stdout)))
	t.Cleanup(func() {
		if child > 0 {
			syscall.Kill(child, syscall.SIGKILL)
		}
	})
	if _, err := st.Drain(); !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("stream past its lifetime: %v, want deadline_exceeded", err)
	}
	// Dead, though unreaped while its child holds the output pipe (envd
	// waits for the pipes before cmd.Wait).
	waitFor(t, "the process itself to die", func() bool { return dead(st.PID()) })
	if child <= 0 || dead(uint32(child)) {
		t.Fatalf("the process's child %d died with it; envd kills only the pid", child)
	}
}

// checkCloseStdinAnswers: envd answers 200 to a second CloseStdin and to
// one for a process started with stdin: false.
func checkCloseStdinAnswers(t *testing.T, x envdTarget) {
	envd := x.as(t, "")
	ctx := ctxFor(t)
	no := false
	for _, stdin := range []*bool{nil, &no} {
		st, err := envd.Start(ctx, e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: "sleep", Args: []string{"5"}}, Stdin: stdin})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := envd.CloseStdin(ctx, e2b.Selector{PID: st.PID()}); err != nil {
				t.Errorf("CloseStdin #%d (stdin %v): %v, want success", i+1, stdin == nil, err)
			}
		}
		envd.SendSignal(ctx, e2b.Selector{PID: st.PID()}, e2b.SIGKILL)
		st.Drain()
	}
}

// checkConnectToEnded: envd keeps an ended process's end event (30 s): a
// Connect to it gets the start event and the end, not not_found.
func checkConnectToEnded(t *testing.T, x envdTarget) {
	envd := x.as(t, "")
	st, err := envd.Start(ctxFor(t), sh("exit 4"))
	if err != nil {
		t.Fatal(err)
	}
	pid := st.PID()
	if _, err := st.Drain(); err != nil {
		t.Fatal(err)
	}
	again, err := envd.Connect(ctxFor(t), e2b.Selector{PID: pid})
	if err != nil || again.PID() != pid {
		t.Fatalf("connect to an ended process: %v, want its start event (pid %d)", err, pid)
	}
	out, err := again.Drain()
	if err != nil || out.End.ExitCode != 4 || out.End.Error != "exit status 4" {
		t.Errorf("connect to an ended process: %+v, %v; want its end, exit 4", out, err)
	}
}

// checkFilesAnswers: a missing file is 404 "path '...' does not exist";
// an upload is read back.
func checkFilesAnswers(t *testing.T, x envdTarget) {
	envd := x.as(t, "")
	ctx := ctxFor(t)
	_, err := envd.ReadFile(ctx, "absent.txt")
	var e *e2b.Error
	if want := "path '" + x.home + "/absent.txt' does not exist"; !errors.As(err, &e) || e.Status != 404 || e.Message != want {
		t.Errorf("read of a missing file: %v, want 404 %s", err, want)
	}
	if err := envd.WriteFile(ctx, "sub/new.txt", strings.NewReader("x")); err != nil {
		t.Fatalf("upload: %v", err)
	}
	if b, err := envd.ReadFile(ctx, "sub/new.txt"); err != nil || string(b) != "x" {
		t.Errorf("read back: %q, %v", b, err)
	}
	// envd writes as root, then gives the file and the directories it
	// made to the user.
	if out := run(t, envd, sh("stat -c %u:%g sub sub/new.txt")); x.switches && string(out.Stdout) != "2001:2001\n2001:2001\n" {
		t.Errorf("owners of an upload: %q, want the user's, 2001:2001", out.Stdout)
	}
}

// dead reports pid gone or a zombie.
func dead(pid uint32) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	return err != nil || strings.Contains(string(b), ") Z ")
}
