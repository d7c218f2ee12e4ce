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
// the other.

// asUser returns an envd client of the fixture's sandbox that names user
// in HTTP Basic, as the SDKs do.
func asUser(t *testing.T, s sandboxFixture, user string) *e2b.Envd {
	t.Helper()
	c, err := e2b.New(e2b.Config{APIKey: e2b.NewSecret(s.srv.APIKey), APIURL: s.srv.URL(), SandboxURL: s.srv.SandboxURL(), User: user})
	if err != nil {
		t.Fatal(err)
	}
	return c.Envd(s.sb)
}

// envOf runs env and returns its variables by name.
func envOf(t *testing.T, envd *e2b.Envd, req e2b.StartRequest) map[string]string {
	t.Helper()
	st, err := envd.Start(ctxFor(t), req)
	if err != nil {
		t.Fatal(err)
	}
	out, err := st.Drain()
	if err != nil || out.End.ExitCode != 0 {
		t.Fatalf("env: %+v, %v", out, err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(string(out.Stdout), "\n"), "\n") {
		k, v, _ := strings.Cut(l, "=")
		m[k] = v
	}
	return m
}

// TestEnvdUserAndEnvironment: envd runs processes as /init's default
// user ("user") or the HTTP Basic user ("root"), in a clean environment:
// its PATH, the user's HOME, USER and LOGNAME, then the request's
// variables; an unknown user is unauthenticated.
func TestEnvdUserAndEnvironment(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	os.Setenv("E2BTEST_HOST_ONLY", "leaks") // never in a process's environment
	defer os.Unsetenv("E2BTEST_HOST_ONLY")
	req := argv("env")
	req.Process.Envs = map[string]string{"ASKED": "1", "USER": "overridden"}
	got := envOf(t, s.envd, req)
	want := map[string]string{"PATH": os.Getenv("PATH"), "HOME": "/home/user", "USER": "overridden", "LOGNAME": "user", "ASKED": "1"}
	names := func(m map[string]string) []string {
		var ks []string
		for k := range m {
			if k != e2btest.TagEnv && k != "PWD" { // the stand-in's tag; sh's PWD
				ks = append(ks, k)
			}
		}
		slices.Sort(ks)
		return ks
	}
	if !slices.Equal(names(got), names(want)) {
		t.Fatalf("environment names %v, want %v", names(got), names(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if root := envOf(t, asUser(t, s, "root"), argv("env")); root["USER"] != "root" || root["HOME"] != "/root" {
		t.Errorf("as root: USER=%q HOME=%q, want root and /root", root["USER"], root["HOME"])
	}
	_, err := asUser(t, s, "nobody-here").Start(ctxFor(t), argv("true"))
	var e *e2b.Error
	if !errors.As(err, &e) || e.Code != e2b.CodeUnauthenticated || !errors.Is(err, adapter.ErrDenied) {
		t.Errorf("start as an unknown user: %v, want unauthenticated (denied)", err)
	}
	_, err = asUser(t, s, "nobody-here").List(ctxFor(t))
	if !errors.As(err, &e) || e.Code != e2b.CodeUnauthenticated || e.Status != 401 {
		t.Errorf("list as an unknown user: %v, want a 401 unauthenticated", err)
	}
}

// TestEnvdCwd: the default working directory is the sandbox's (standing
// for /home/user).
func TestEnvdCwd(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	st, err := s.envd.Start(ctxFor(t), argv("pwd"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := st.Drain()
	if err != nil || string(out.Stdout) != s.dir+"\n" {
		t.Errorf("pwd: %q, %v; want %q", out.Stdout, err, s.dir)
	}
}

// TestEnvdLifetimeKillsOnlyThePID: Connect-Timeout-Ms ends the process
// envd started (exec.CommandContext kills its pid), not its group: a
// child it left behind lives on.
func TestEnvdLifetimeKillsOnlyThePID(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	req := sh(`sleep 60 & echo $!; wait`)
	req.Lifetime = 500 * time.Millisecond
	st, err := s.envd.Start(ctxFor(t), req)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(ev.Stdout)))
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	if _, err := st.Drain(); !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("stream past its lifetime: %v, want deadline_exceeded", err)
	}
	// Dead, though unreaped while its child holds the output pipe (envd
	// too waits for the pipes before cmd.Wait).
	waitFor(t, "the process itself to die", func() bool { return dead(st.PID()) })
	if child <= 0 || dead(uint32(child)) {
		t.Fatalf("the process's child %d died with it; envd kills only the pid", child)
	}
}

// TestEnvdCloseStdinAnswers: envd answers 200 to a second CloseStdin and
// to one for a process started with stdin: false.
func TestEnvdCloseStdinAnswers(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	st, err := s.envd.Start(ctx, argv("sleep", "5"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.envd.SendSignal(ctx, e2b.Selector{PID: st.PID()}, e2b.SIGKILL)
	for i := range 2 {
		if err := s.envd.CloseStdin(ctx, e2b.Selector{PID: st.PID()}); err != nil {
			t.Errorf("CloseStdin #%d: %v, want success", i+1, err)
		}
	}
	no := false
	st2, err := s.envd.Start(ctx, e2b.StartRequest{Process: e2b.ProcessConfig{Cmd: "sleep", Args: []string{"5"}}, Stdin: &no})
	if err != nil {
		t.Fatal(err)
	}
	defer s.envd.SendSignal(ctx, e2b.Selector{PID: st2.PID()}, e2b.SIGKILL)
	if err := s.envd.CloseStdin(ctx, e2b.Selector{PID: st2.PID()}); err != nil {
		t.Errorf("CloseStdin of a stdin: false process: %v, want success", err)
	}
}

// TestEnvdFilesAnswers: envd's files API: a missing file is 404 with
// "path '...' does not exist" (not_found of the file only, never of the
// sandbox); an upload's answer is 200.
func TestEnvdFilesAnswers(t *testing.T) {
	s := newSandbox(t, e2btest.Options{})
	ctx := ctxFor(t)
	_, err := s.envd.ReadFile(ctx, "absent.txt")
	var e *e2b.Error
	if !errors.As(err, &e) || e.Status != 404 || e.Message != "path '"+s.dir+"/absent.txt' does not exist" {
		t.Errorf("read of a missing file: %#v, want 404 path '%s/absent.txt' does not exist", err, s.dir)
	}
	if errors.Is(err, adapter.ErrNotFound) && !strings.Contains(err.Error(), "absent.txt") {
		t.Errorf("read of a missing file: %v names no file", err)
	}
	if err := s.envd.WriteFile(ctx, "sub/new.txt", strings.NewReader("x")); err != nil {
		t.Fatalf("upload: %v", err)
	}
	if b, err := s.envd.ReadFile(ctx, "sub/new.txt"); err != nil || string(b) != "x" {
		t.Errorf("read back: %q, %v", b, err)
	}
}

// dead reports pid gone or a zombie.
func dead(pid uint32) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	return err != nil || strings.Contains(string(b), ") Z ")
}
