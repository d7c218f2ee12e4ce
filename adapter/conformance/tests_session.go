package conformance

// Session checks: Spawn reports the exit code and stderr in exactly one
// terminal frame and is idempotent per session id, stdin is delivered in
// full and refused after exit, detached sessions are listed with their
// state, and terminate_session ends a running session.

import (
	"fmt"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
)

func testSpawnExitCode(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	e.spawn(hd, e.fx.ExecFail, adapter.SpawnOptions{}).wantExit("exited with code 3 (streaming path)", code(3))
}

func testOneTerminalFrame(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	for _, c := range []adapter.Command{e.fx.SpawnOK, e.fx.ExecFail, e.fx.Stderr} {
		r := e.spawn(hd, c, adapter.SpawnOptions{}).rest()
		if r.terminals != 1 {
			t.Errorf("Spawn(%v): %d terminal frames, want exactly 1", c, r.terminals)
		}
	}
	r := e.spawn(hd, e.fx.SpawnOK, adapter.SpawnOptions{}).rest()
	if r.exit == nil || !success(*r.exit) {
		t.Errorf("Spawn(SpawnOK): terminal %v/%v, want exited 0", r.exit, r.err)
	}
	if len(r.out[0])+len(r.out[1]) == 0 {
		t.Errorf("Spawn(SpawnOK) delivered no output")
	}
}

func testSpawnStderr(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.spawn(hd, e.fx.Stderr, adapter.SpawnOptions{})
	r.wantExit("exit 0", success)
	if string(r.out[0]) != e.fx.StderrStdout || string(r.out[1]) != e.fx.StderrStderr {
		t.Errorf("Spawn(Stderr) = stdout %s stderr %s, want %q and %q, kept apart", quoteAll(r.out[0]), quoteAll(r.out[1]), e.fx.StderrStdout, e.fx.StderrStderr)
	}
}

func testSpawnSessionID(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	id := "conformance-retry-1"
	first := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{SessionID: id})
	if got := first.st.SessionID(); got != id {
		t.Fatalf("Spawn(SessionID %q) gave session %q", id, got)
	}
	if !first.stdoutHas("ready") {
		t.Fatalf("SpawnStay printed %s, want ready", quoteAll(first.out[0]))
	}
	retry := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{SessionID: id})
	if got := retry.st.SessionID(); got != id {
		t.Errorf("retried Spawn(SessionID %q) gave session %q, want the same", id, got)
	}
	if st, err := e.a.Spawn(e.ctx, hd, e.fx.ExecFail, adapter.SpawnOptions{SessionID: id}); err == nil {
		_ = st.Close()
		t.Errorf("Spawn(SessionID %q) of a different command = nil error, want invalid", id)
	} else {
		e.wantKind("Spawn(same SessionID, different command)", err, &adapter.InvalidError{})
	}
	infos, err := e.a.Sessions(e.ctx, hd)
	if err != nil {
		t.Fatalf("Sessions = %v", err)
	}
	n := 0
	for _, in := range infos {
		if in.ID == id {
			n++
		}
	}
	if n != 1 {
		t.Errorf("Sessions lists %d sessions with id %q after a retried spawn, want 1 (no second process)", n, id)
	}
	if err := e.a.WriteStdin(e.ctx, hd, id, []byte("once\n")); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	if err := e.a.CloseStdin(e.ctx, hd, id); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	for _, r := range []*reader{first, retry} {
		r.wantExit("exit 0", success)
		if got := strings.Count(string(r.out[0]), "once\n"); got != 1 {
			t.Errorf("%s: stdout %s echoes the input %d times, want once (one process)", r.label, quoteAll(r.out[0]), got)
		}
	}
}

func testStdinTotal(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	id := r.st.SessionID()
	// No wait for "ready": spawn returns only once the process runs, so a
	// write right after it is not lost.
	for i, msg := range []string{"first message\n", "second message\n", "third message\n"} {
		if err := e.a.WriteStdin(e.ctx, hd, id, []byte(msg)); err != nil {
			t.Fatalf("WriteStdin #%d = %v", i+1, err)
		}
		if !r.stdoutHas(msg) {
			t.Fatalf("after write #%d stdout = %s, want the echo of %q", i+1, quoteAll(r.out[0]), msg)
		}
		if !r.quiet(30 * time.Millisecond) {
			t.Fatalf("the command ended after write #%d, before CloseStdin: a write must never send EOF (terminal %v/%v)", i+1, r.exit, r.err)
		}
	}
	if err := e.a.CloseStdin(e.ctx, hd, id); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	r.wantExit("exit 0 on EOF", success)
	if want := "ready\nfirst message\nsecond message\nthird message\n"; trimNL(string(r.out[0])) != trimNL(want) {
		t.Errorf("stdout = %s, want %q", quoteAll(r.out[0]), want)
	}
	err := e.a.WriteStdin(e.ctx, hd, id, []byte("late\n"))
	e.wantKind("WriteStdin after exit", err, adapter.ErrCommandExited)
	err = e.a.CloseStdin(e.ctx, hd, id)
	e.wantKind("CloseStdin after exit", err, adapter.ErrCommandExited)
	_, err = e.a.Exec(e.ctx, hd, e.fx.ExecOK) // the sandbox is fine after all that
	if err != nil {
		t.Errorf("Exec after the stdin session = %v", err)
	}
	err = e.a.WriteStdin(e.ctx, hd, "conformance-no-such-session", []byte("x"))
	e.wantKind("WriteStdin(unknown session)", err, adapter.ErrNotFound)
}

func findSession(t T, infos []adapter.SessionInfo, id string) (adapter.SessionInfo, bool) {
	t.Helper()
	for _, in := range infos {
		if in.ID == id {
			return in, true
		}
	}
	return adapter.SessionInfo{}, false
}

func testDetached(t T, h Harness) {
	e := setup(t, h)
	if !e.a.Capabilities().Has(adapter.CapAttach) {
		t.Skipf("the adapter does not advertise attach; Capability/attach checks that it refuses")
	}
	hd := e.create()
	// A session that fails with 3 while nobody listens.
	fail := e.spawn(hd, e.fx.ExecFail, adapter.SpawnOptions{})
	failID := fail.st.SessionID()
	_ = fail.st.Close()
	// A session that stays, dropped mid-command.
	stay := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	stayID := stay.st.SessionID()
	if !stay.stdoutHas("ready") {
		t.Fatalf("SpawnStay printed %s, want ready", quoteAll(stay.out[0]))
	}
	if err := stay.st.Close(); err != nil {
		t.Errorf("Stream.Close = %v, want nil", err)
	}
	_ = stay.st.Close() // idempotent
	infos, err := e.a.Sessions(e.ctx, hd)
	if err != nil {
		t.Fatalf("Sessions = %v", err)
	}
	in, ok := findSession(t, infos, stayID)
	if !ok {
		t.Fatalf("Sessions = %v, want it to list the dropped session %q", infos, stayID)
	}
	if in.State != adapter.SessionRunning {
		t.Errorf("dropped session state = %q, want running: Close must detach only the local transport", in.State)
	}
	if _, ok := findSession(t, infos, failID); !ok {
		t.Errorf("Sessions = %v, want it to list %q", infos, failID)
	}
	re := e.attach(hd, stayID, adapter.Cursor{})
	if !re.stdoutHas("ready") {
		t.Errorf("rejoined stdout = %s, want ready", quoteAll(re.out[0]))
	}
	if err := e.a.WriteStdin(e.ctx, hd, stayID, []byte("after rejoin\n")); err != nil {
		t.Fatalf("WriteStdin after rejoin = %v", err)
	}
	if !re.stdoutHas("after rejoin") {
		t.Errorf("rejoined stdout = %s, want the echo", quoteAll(re.out[0]))
	}
	if err := e.a.CloseStdin(e.ctx, hd, stayID); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	re.wantExit("exit 0", success)
	e.attach(hd, failID, adapter.Cursor{}).wantExit("the real exit code 3 after a rejoin", code(3))
	infos, err = e.a.Sessions(e.ctx, hd)
	if err != nil {
		t.Fatalf("Sessions = %v", err)
	}
	if in, ok := findSession(t, infos, failID); !ok || in.State != adapter.SessionExited || in.Exit == nil || in.Exit.Code != 3 {
		t.Errorf("Sessions shows %+v for the failed session, want exited with code 3", in)
	}
}

func testTerminate(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	id := r.st.SessionID()
	if !e.a.Capabilities().Has(adapter.CapTerminateSession) {
		_, err := e.a.TerminateSession(e.ctx, hd, id, time.Second)
		e.wantKind("TerminateSession without the capability", err, adapter.ErrNotSupported)
		if _, err := e.a.Get(e.ctx, hd.Name); err != nil {
			t.Errorf("after a refused TerminateSession, Get = %v: never destroy as a fallback", err)
		}
		_ = e.a.CloseStdin(e.ctx, hd, id)
		r.rest()
		return
	}
	if !r.stdoutHas("ready") {
		t.Fatalf("SpawnStay printed %s, want ready", quoteAll(r.out[0]))
	}
	for _, g := range []time.Duration{0, -time.Second, adapter.MaxGrace + time.Millisecond} {
		_, err := e.a.TerminateSession(e.ctx, hd, id, g)
		e.wantKind(fmt.Sprintf("TerminateSession(grace %v)", g), err, &adapter.InvalidError{})
	}
	if !r.quiet(10 * time.Millisecond) {
		t.Fatalf("a refused TerminateSession ended the session")
	}
	ex, err := e.a.TerminateSession(e.ctx, hd, id, 200*time.Millisecond)
	if err != nil {
		t.Fatalf("TerminateSession = %v", err)
	}
	if !ex.Valid() || ex.Success() {
		t.Errorf("TerminateSession = %+v, want a valid exit that is not success", ex)
	}
	got := r.wantExit("the terminated exit", func(adapter.Exit) bool { return true })
	if got != ex {
		t.Errorf("terminal frame %v, TerminateSession returned %v: the answer must be the final frame's", got, ex)
	}
	again, err := e.a.TerminateSession(e.ctx, hd, id, time.Second)
	if err != nil || again != ex {
		t.Errorf("TerminateSession of an ended session = %v, %v; want its recorded exit %v", again, err, ex)
	}
	infos, err := e.a.Sessions(e.ctx, hd)
	if err != nil {
		t.Fatalf("Sessions = %v", err)
	}
	if in, _ := findSession(t, infos, id); in.State == adapter.SessionRunning {
		t.Errorf("terminated session still listed as running")
	}
	e.wantKind("WriteStdin after terminate", e.a.WriteStdin(e.ctx, hd, id, []byte("x")), adapter.ErrCommandExited)
}
