package daemon_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// proc is a real runnerd process serving on a unix socket in state.
type proc struct {
	cmd  *exec.Cmd
	done chan error
}

func startProcess(t *testing.T, state string, extra ...string) (*api, *proc) {
	t.Helper()
	return startProcessWrapped(t, state, nil, extra...)
}

// startProcessWrapped is startProcess with runnerd run by wrapper (e.g.
// prlimit ... --), which must exec it in its own process.
func startProcessWrapped(t *testing.T, state string, wrapper []string, extra ...string) (*api, *proc) {
	t.Helper()
	passableState(t, state)
	endLeftoverSessions(t, state)
	sock := filepath.Join(state, "runnerd.sock")
	args := []string{"--state", state, "--listen", "none", "--socket", sock, "--netpolicy", "off"}
	if !slices.Contains(extra, "--cgroup-root") {
		args = append(args, "--cgroup-root", stateCgroupRoot(t, state)) // see startDaemonStoppable
	}
	argv := append(append(append([]string{}, wrapper...), runnerdBin), append(args, extra...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN="+testToken)
	cmd.Stdout = os.Stderr
	cmd.Stderr = &logWriterIO{t: t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		// A clean stop: runnerd waits for its warm shims, idle or being
		// started, to remove their staging directories (killed, they do
		// it on their own, racing TempDir's RemoveAll).
		p.kill(syscall.SIGTERM)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if m, _ := filepath.Glob(filepath.Join(state, "s", ".warm-*")); len(m) == 0 {
				return
			}
		}
	})
	hc := unixHTTP(sock)
	a := &api{t: t, base: "http://runnerd", hc: hc, token: testToken, state: state}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get(a.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return a, p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("runnerd did not come up: %v", err)
		}
		select {
		case err := <-p.done:
			t.Fatalf("runnerd exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill signals the process and waits for it. Idempotent.
func (p *proc) kill(sig syscall.Signal) {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

type logWriterIO struct{ t *testing.T }

func (w *logWriterIO) Write(p []byte) (int, error) { return len(p), nil }

// restartTest streams a session, reads part of it, stops runnerd with sig,
// starts a new one on the same state, and checks that attaching from the
// cursors returns exactly the missing bytes and the real exit code.
func restartTest(t *testing.T, sig syscall.Signal) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	a.createSandbox("box")
	script := `for i in $(seq 1 40); do echo "out $i"; echo "err $i" >&2; sleep 0.05; done; exit 7`
	sess := a.spawn("box", wire.CreateSession{ID: "turn", Argv: []string{"sh", "-c", script}})
	var wantOut, wantErr bytes.Buffer
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	// Read some of it live, then lose the daemon mid-stream.
	first := a.attach(ctxFor(t, 30*time.Second), "box", sess.ID, "", func(f wire.Frame) bool {
		return f.Stream == wire.StreamStdout && f.End() >= 30
	})
	if first.terminal != nil {
		t.Fatal("session ended too early for the test")
	}
	p.kill(sig)
	// The command keeps running without its daemon.
	if err := syscall.Kill(sess.PID, 0); err != nil {
		t.Fatalf("command died with runnerd: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	a2, _ := startProcess(t, state)
	var list wire.SessionList
	a2.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].ID != "turn" {
		t.Fatalf("sessions after restart: %+v", list.Sessions)
	}
	q := fmt.Sprintf("stdout=%d&stderr=%d", first.ends["stdout"], first.ends["stderr"])
	rest := a2.attach(ctxFor(t, 30*time.Second), "box", sess.ID, q, nil)
	gotOut := append(append([]byte{}, first.streams["stdout"]...), rest.streams["stdout"]...)
	gotErr := append(append([]byte{}, first.streams["stderr"]...), rest.streams["stderr"]...)
	if !bytes.Equal(gotOut, wantOut.Bytes()) || !bytes.Equal(gotErr, wantErr.Bytes()) {
		t.Errorf("stdout %q\nstderr %q", gotOut, gotErr)
	}
	if rest.terminal == nil || rest.terminal.Kind != wire.FrameExit || rest.exit.Code != 7 || rest.exit.Reason != "exited" {
		t.Errorf("terminal %+v exit %+v", rest.terminal, rest.exit)
	}
	a2.destroyAll()
}

func TestRestartAfterKill9(t *testing.T) { restartTest(t, syscall.SIGKILL) }

func TestRestartAfterCleanStop(t *testing.T) { restartTest(t, syscall.SIGTERM) }

func TestShimDeathIsLost(t *testing.T) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{ID: "doomed", Argv: []string{"sh", "-c", "echo before; exec sleep 60"}})
	a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", func(wire.Frame) bool { return true })
	pids, _ := filepath.Glob(filepath.Join(state, "s", "[^.]*", "shim.pid")) // not warm shims' staging
	if len(pids) != 1 {
		t.Fatalf("shim.pid files: %v", pids)
	}
	var shimPID int
	raw, _ := os.ReadFile(pids[0])
	fmt.Sscan(string(raw), &shimPID)
	// The shim and the command die without an exit record, while runnerd
	// is down.
	p.kill(syscall.SIGKILL)
	syscall.Kill(shimPID, syscall.SIGKILL)
	syscall.Kill(sess.PID, syscall.SIGKILL)
	if err := processGone(shimPID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	a2, _ := startProcess(t, state)
	var s wire.Session
	a2.must("GET", "/v1/sandboxes/box/sessions/doomed", nil, 200, &s)
	if s.State != "lost" || s.Exit == nil || s.Exit.Reason != "lost" {
		t.Errorf("session %+v", s)
	}
	at := a2.attach(ctxFor(t, 10*time.Second), "box", "doomed", "", nil)
	if at.terminal == nil || at.terminal.Kind != wire.FrameLost || string(at.streams["stdout"]) != "before\n" {
		t.Errorf("attach: terminal %+v stdout %q", at.terminal, at.streams["stdout"])
	}
	a2.wantError(a2.do("POST", "/v1/sandboxes/box/sessions/doomed/stdin", "x"), 409, wire.CodeCommandExited)
}
