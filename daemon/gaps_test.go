package daemon_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/wire"
)

// waitEnded polls GET session until the session is no longer running.
func (a *api) waitEnded(sandbox, id string) wire.Session {
	a.t.Helper()
	return a.waitEndedWithin(sandbox, id, 15*time.Second)
}

// waitEndedWithin is waitEnded failing the test after d.
func (a *api) waitEndedWithin(sandbox, id string, d time.Duration) wire.Session {
	a.t.Helper()
	deadline := time.Now().Add(d)
	for {
		var s wire.Session
		a.must("GET", "/v1/sandboxes/"+sandbox+"/sessions/"+id, nil, 200, &s)
		if s.State != wire.SessionRunning {
			return s
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("session %s still running", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTerminatedMarkerSurvivesRestart: the exit record says terminated
// exactly when the command ended after a terminate (or a suspend), keeps
// the true code and signal, and says so again from a restarted runnerd. A
// SIGTERM through the signal endpoint is not a terminate.
func TestTerminatedMarkerSurvivesRestart(t *testing.T) {
	state := t.TempDir()
	a, p := startProcess(t, state)
	a.createSandbox("box")
	killed := a.spawn("box", wire.CreateSession{ID: "killed", Argv: []string{"sleep", "60"}})
	trapped := a.spawn("box", wire.CreateSession{ID: "trapped", Argv: []string{"sh", "-c", "trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done"}})
	signaled := a.spawn("box", wire.CreateSession{ID: "signaled", Argv: []string{"sleep", "60"}})
	parked := a.spawn("box", wire.CreateSession{ID: "parked", Argv: []string{"sleep", "60"}})
	a.attach(ctxFor(t, 10*time.Second), "box", trapped.ID, "", func(wire.Frame) bool { return true })

	var exit wire.Exit
	a.must("POST", "/v1/sandboxes/box/sessions/"+killed.ID+"/terminate", `{"grace_ms":5000}`, 200, &exit)
	if !exit.Terminated || exit.Reason != wire.ExitSignaled || exit.Signal != 15 {
		t.Errorf("terminate answer: got %+v, want signaled 15, terminated", exit)
	}
	a.must("POST", "/v1/sandboxes/box/sessions/"+trapped.ID+"/terminate", `{"grace_ms":5000}`, 200, &exit)
	if !exit.Terminated || exit.Reason != wire.ExitExited || exit.Code != 7 {
		t.Errorf("terminate answer of a TERM-trapping command: got %+v, want exited 7, terminated", exit)
	}
	a.must("POST", "/v1/sandboxes/box/sessions/"+signaled.ID+"/signal", `{"signal":"TERM"}`, 204, nil)
	a.waitEnded("box", signaled.ID)
	var sb wire.Sandbox
	a.must("POST", "/v1/sandboxes/box/suspend", nil, 200, &sb)

	p.kill(syscall.SIGTERM)
	a, _ = startProcess(t, state)
	want := map[string]wire.Exit{
		killed.ID:   {Reason: wire.ExitSignaled, Signal: 15, Code: 143, Terminated: true},
		trapped.ID:  {Reason: wire.ExitExited, Code: 7, Terminated: true},
		signaled.ID: {Reason: wire.ExitSignaled, Signal: 15, Code: 143},
		parked.ID:   {Reason: wire.ExitSignaled, Signal: 15, Code: 143, Terminated: true},
	}
	var list wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &list)
	if len(list.Sessions) != len(want) {
		t.Fatalf("got %d sessions, want %d", len(list.Sessions), len(want))
	}
	for _, s := range list.Sessions {
		w := want[s.ID]
		if s.Exit == nil || s.Exit.Reason != w.Reason || s.Exit.Code != w.Code || s.Exit.Signal != w.Signal || s.Exit.Terminated != w.Terminated {
			t.Errorf("session %s after restart: got exit %+v, want %+v", s.ID, s.Exit, w)
		}
	}
	// The attach's exit frame carries it too.
	at := a.attach(ctxFor(t, 10*time.Second), "box", killed.ID, "", nil)
	if !at.exit.Terminated {
		t.Errorf("exit frame after restart: got %+v, want terminated", at.exit)
	}
}

// TestIncarnationQuery: a call that names an incarnation that is not the
// live one is 404 not_found (a DELETE: 204) and touches nothing.
func TestIncarnationQuery(t *testing.T) {
	a := startDaemon(t)
	old := a.createSandbox("box")
	a.must("DELETE", "/v1/sandboxes/box", nil, 204, nil)
	cur := a.createSandbox("box")
	if cur.Incarnation == old.Incarnation {
		t.Fatal("re-create kept the incarnation")
	}
	sess := a.spawn("box", wire.CreateSession{ID: "s1", Argv: []string{"sleep", "60"}})
	stale := "?incarnation=" + old.Incarnation
	live := "?incarnation=" + cur.Incarnation

	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/box", ""},
		{"GET", "/v1/sandboxes/box/sessions", ""},
		{"GET", "/v1/sandboxes/box/sessions/s1", ""},
		{"POST", "/v1/sandboxes/box/sessions", `{"argv":["true"]}`},
		{"POST", "/v1/sandboxes/box/exec", `{"argv":["true"]}`},
		{"POST", "/v1/sandboxes/box/sessions/s1/stdin", "x"},
		{"POST", "/v1/sandboxes/box/sessions/s1/signal", `{"signal":"KILL"}`},
		{"POST", "/v1/sandboxes/box/sessions/s1/terminate", `{"grace_ms":100}`},
		{"GET", "/v1/sandboxes/box/sessions/s1/streams/stdout", ""},
		{"POST", "/v1/sandboxes/box/suspend", ""},
		{"POST", "/v1/sandboxes/box/resume", ""},
	} {
		r := a.do(c.method, c.path+stale, c.body)
		if r.status != 404 || r.code() != wire.CodeNotFound {
			t.Errorf("%s %s with a stale incarnation: got %d %s, want 404 not_found", c.method, c.path, r.status, r.body)
		}
	}
	a.must("DELETE", "/v1/sandboxes/box"+stale, nil, 204, nil)
	var got wire.Sandbox
	a.must("GET", "/v1/sandboxes/box"+live, nil, 200, &got)
	if got.Incarnation != cur.Incarnation {
		t.Fatalf("after a stale DELETE: incarnation %s, want %s", got.Incarnation, cur.Incarnation)
	}
	var s wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/s1"+live, nil, 200, &s)
	if s.State != wire.SessionRunning {
		t.Fatalf("a stale DELETE stopped the live sandbox's session: %+v", s)
	}
	a.must("DELETE", "/v1/sandboxes/box"+live, nil, 204, nil)
	a.wantError(a.do("GET", "/v1/sandboxes/box", nil), 404, wire.CodeNotFound)
	_ = sess
}

// TestLiveLengths: a running session's JSON carries the current length of
// each stream; an ended one's the final lengths.
func TestLiveLengths(t *testing.T) {
	a := startDaemon(t)
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{ID: "s1", Argv: []string{"sh", "-c", "printf abc; printf de >&2; exec sleep 60"}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		var s wire.Session
		a.must("GET", "/v1/sandboxes/box/sessions/"+sess.ID, nil, 200, &s)
		if s.State != wire.SessionRunning {
			t.Fatalf("session ended: %+v", s)
		}
		if s.Lengths["stdout"] == 3 && s.Lengths["stderr"] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lengths: got %v, want stdout 3 stderr 2", s.Lengths)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var list wire.SessionList
	a.must("GET", "/v1/sandboxes/box/sessions", nil, 200, &list)
	if l := list.Sessions[0].Lengths; l["stdout"] != 3 || l["stderr"] != 2 {
		t.Errorf("listing lengths: got %v, want stdout 3 stderr 2", l)
	}
	a.must("POST", "/v1/sandboxes/box/sessions/"+sess.ID+"/terminate", `{"grace_ms":500}`, 200, nil)
	var s wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/"+sess.ID, nil, 200, &s)
	if s.Lengths["stdout"] != 3 || s.Lengths["stderr"] != 2 {
		t.Errorf("lengths after the end: got %v, want stdout 3 stderr 2", s.Lengths)
	}
}

// TestWriteFailed: when a session's journal cannot be written (its
// filesystem is full), GET session says write_error and a terminate whose
// exit record cannot be written answers 507 write_failed promptly instead
// of waiting out its deadline. Once there is space the record appears,
// terminated.
func TestWriteFailed(t *testing.T) {
	testcap.Root(t, "mounts a tmpfs to fill a journal's filesystem")
	state := t.TempDir()
	sdir := filepath.Join(state, "s")
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sdir, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(sdir, 0); err != nil {
			unix.Unmount(sdir, unix.MNT_DETACH)
		}
	})
	a := startDaemonCfg(t, daemon.Config{StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff})
	a.createSandbox("box")
	sess := a.spawn("box", wire.CreateSession{ID: "s1", Argv: []string{"sh", "-c", "echo ready; exec sleep 60"}})
	a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", func(wire.Frame) bool { return true })

	// Without its reserve, as a journal recovered after its writer
	// crashed is: with it, the exit record is written on a full disk
	// (TestDiskFullFlood).
	reserves, _ := filepath.Glob(filepath.Join(sdir, "[^.]*", "journal", journal.ReserveFile))
	if len(reserves) != 1 {
		t.Fatalf("journal reserves of the session: %v, want one", reserves)
	}
	if err := os.Remove(reserves[0]); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(sdir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filler) })
	buf := make([]byte, 64<<10)
	for _, n := range []int{len(buf), 4096, 512, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	f.Close()

	t0 := time.Now()
	a.wantError(a.do("POST", "/v1/sandboxes/box/sessions/s1/terminate", `{"grace_ms":200}`), 507, wire.CodeWriteFailed)
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("terminate took %v to say write_failed", took)
	}
	var s wire.Session
	a.must("GET", "/v1/sandboxes/box/sessions/s1", nil, 200, &s)
	if s.WriteError == "" || s.State != wire.SessionRunning {
		t.Errorf("session while its exit cannot be recorded: got state %q write_error %q, want running with a write_error", s.State, s.WriteError)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	s = a.waitEnded("box", "s1")
	if s.Exit == nil || !s.Exit.Terminated || s.WriteError != "" {
		t.Errorf("after space came back: got %+v exit %+v, want terminated, no write_error", s, s.Exit)
	}
}

// TestListenFile: runnerd writes its actual addresses to STATE/listen.json
// (0600) while it serves and removes the file at a clean stop.
func TestListenFile(t *testing.T) {
	state := t.TempDir()
	_, p := startProcess(t, state)
	path := filepath.Join(state, wire.ListenFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("listen file: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("listen file mode: got %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var l wire.Listen
	if err := jsonUnmarshal(b, &l); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	if want := filepath.Join(state, "runnerd.sock"); l.Socket != want || l.TCP != "" || l.PID != p.cmd.Process.Pid {
		t.Errorf("listen file: got %+v, want socket %s, no tcp, pid %d", l, want, p.cmd.Process.Pid)
	}
	p.kill(syscall.SIGTERM)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("after a clean stop: listen file stat err %v, want not exist", err)
	}
}
