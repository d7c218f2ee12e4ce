package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// Tests returns the suite's subtests, in order. [Run] runs them all; a
// caller with its own T (a recorder) can run them one by one.
func Tests() []Test {
	return []Test{
		{"Capabilities/Known", testCapabilitiesKnown},
		{"Create/Idempotent", testCreateIdempotent},
		{"Create/NewIncarnation", testCreateNewIncarnation},
		{"Get/NotFoundAfterDestroy", testGetNotFound},
		{"Get/OutageIsNeverNotFound", testOutage},
		{"Destroy/AbsentIsSuccess", testDestroyAbsent},
		{"List/Paged", testListPaged},
		{"List/InterruptedIsAnError", testListInterrupted},
		{"Exec/OK", testExecOK},
		{"Exec/ExitCode", testExecExitCode},
		{"Exec/Stderr", testExecStderr},
		{"Exec/NeverPanics", testExecNeverPanics},
		{"Spawn/ExitCode", testSpawnExitCode},
		{"Spawn/OneTerminalFrame", testOneTerminalFrame},
		{"Spawn/Stderr", testSpawnStderr},
		{"Spawn/SessionIDIdempotent", testSpawnSessionID},
		{"Stdin/Total", testStdinTotal},
		{"Sessions/Detached", testDetached},
		{"Capability/attach", testAttach},
		{"Attach/ReplayCursor", testAttachCursors},
		{"Capability/terminate_session", testTerminate},
		{"Capability/suspend", testSuspend},
		{"Capability/network_policy", testNetworkPolicy},
		{"Capability/public_url", testPublicURL},
		{"Capability/tty", testTTY},
		{"Capability/checkpoint", testCheckpoint},
	}
}

// skipHook skips loudly when the adapter did not supply a fault hook.
func skipHook(t T, hook string) {
	t.Helper()
	t.Skipf("SKIPPED, NOT VERIFIED: the adapter's harness supplies no %s hook, so this requirement is unchecked for it", hook)
}

func testCapabilitiesKnown(t T, h Harness) {
	e := setup(t, h)
	caps := e.a.Capabilities()
	seen := map[adapter.Capability]bool{}
	for _, c := range caps {
		if !slices.Contains(adapter.AllCapabilities(), c) {
			t.Errorf("Capabilities() advertises unknown capability %q", c)
		}
		if seen[c] {
			t.Errorf("Capabilities() lists %q twice", c)
		}
		seen[c] = true
	}
	if !slices.Equal(caps, e.a.Capabilities()) {
		t.Errorf("Capabilities() changed between calls")
	}
	if e.a.Provider() == "" {
		t.Errorf("Provider() is empty")
	}
}

func testCreateIdempotent(t T, h Harness) {
	e := setup(t, h)
	name := e.name()
	const n = 8
	hs := make([]adapter.Handle, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { hs[i], errs[i] = e.a.Create(e.ctx, name, adapter.CreateOptions{}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("concurrent Create(%q) #%d = %v", name, i, errs[i])
		}
	}
	t.Cleanup(func() { e.destroyQuietly(hs[0]) })
	for i := range n {
		if !hs[i].Same(hs[0]) {
			t.Errorf("concurrent Create(%q) gave handles %v and %v, want one sandbox", name, hs[0], hs[i])
		}
	}
	h0 := hs[0]
	if h0.Provider != e.a.Provider() || h0.Name != name || h0.ID == "" {
		t.Errorf("Create(%q) = %v, want provider %q, that name and an incarnation id", name, h0, e.a.Provider())
	}
	again, err := e.a.Create(e.ctx, name, adapter.CreateOptions{})
	if err != nil || !again.Same(h0) {
		t.Errorf("second Create(%q) = %v, %v; want %v", name, again, err, h0)
	}
	got, err := e.a.Get(e.ctx, name)
	if err != nil || !got.Same(h0) {
		t.Errorf("Get(%q) = %v, %v; want %v", name, got, err, h0)
	}
	hsAll, err := adapter.ListAll(e.ctx, e.a, 0, 0)
	if err != nil {
		t.Fatalf("ListAll = %v", err)
	}
	count := 0
	for _, x := range hsAll {
		if x.Name == name {
			count++
		}
	}
	if count != 1 {
		t.Errorf("listing shows %d sandboxes named %q, want 1", count, name)
	}
}

func testCreateNewIncarnation(t T, h Harness) {
	e := setup(t, h)
	name := e.name()
	old := e.createNamed(name, adapter.CreateOptions{})
	if err := e.a.Destroy(e.ctx, old); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	cur := e.createNamed(name, adapter.CreateOptions{})
	if cur.ID == old.ID {
		t.Errorf("re-create after destroy kept incarnation id %q, want a new one", cur.ID)
	}
	if _, err := e.a.Sessions(e.ctx, old); !errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("Sessions(stale handle) = %v, want not_found (that incarnation is gone)", err)
	}
	if err := e.a.Destroy(e.ctx, old); err != nil {
		t.Errorf("Destroy(stale handle) = %v, want nil", err)
	}
	if got, err := e.a.Get(e.ctx, name); err != nil || !got.Same(cur) {
		t.Errorf("after Destroy(stale handle), Get = %v, %v; want the new incarnation %v untouched", got, err, cur)
	}
}

func testGetNotFound(t T, h Harness) {
	e := setup(t, h)
	never := e.name()
	_, err := e.a.Get(e.ctx, never)
	e.wantKind(fmt.Sprintf("Get(never created %q)", never), err, adapter.ErrNotFound)
	hd := e.create()
	if err := e.a.Destroy(e.ctx, hd); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	_, err = e.a.Get(e.ctx, hd.Name)
	e.wantKind("Get(destroyed)", err, adapter.ErrNotFound)
	if adapter.Transient(err) {
		t.Errorf("Get(destroyed) error %v is transient, want definitive", err)
	}
}

func testOutage(t T, h Harness) {
	e := setup(t, h)
	if e.s.Outage == nil {
		skipHook(t, "Outage")
	}
	hd := e.create()
	stay := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	if !stay.stdoutHas("ready") {
		t.Fatalf("SpawnStay printed %s, want ready", quoteAll(stay.out[0]))
	}
	id := stay.st.SessionID()
	restore := e.s.Outage()
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()
	check := func(call string, err error) {
		t.Helper()
		if errors.Is(err, adapter.ErrNotFound) || errors.Is(err, adapter.ErrLost) {
			t.Errorf("during an outage %s = %v: a live sandbox must never read as gone", call, err)
		}
	}
	_, err := e.a.Get(e.ctx, hd.Name)
	check("Get", err)
	if err != nil && !adapter.Transient(err) {
		t.Errorf("during an outage Get = %v (kind %s), want a transient error", err, adapter.KindOf(err))
	}
	_, err = e.a.Create(e.ctx, hd.Name, adapter.CreateOptions{})
	check("Create(existing)", err)
	_, err = e.a.Sessions(e.ctx, hd)
	check("Sessions", err)
	_, err = e.a.Exec(e.ctx, hd, e.fx.ExecOK)
	check("Exec", err)
	check("WriteStdin", e.a.WriteStdin(e.ctx, hd, id, []byte("x\n")))
	if st, err := e.a.Attach(e.ctx, hd, id, adapter.Cursor{}); err == nil {
		_ = st.Close()
	} else if !errors.Is(err, adapter.ErrNotSupported) {
		check("Attach", err)
	}
	p, err := e.a.List(e.ctx, adapter.ListOptions{})
	check("List", err)
	if err == nil && p.NextPageToken == "" && !slices.ContainsFunc(p.Handles, hd.Same) {
		t.Errorf("during an outage List returned a complete listing without %v, want an error", hd)
	}
	restore()
	restored = true
	if got, err := e.a.Get(e.ctx, hd.Name); err != nil || !got.Same(hd) {
		t.Errorf("after the outage Get = %v, %v; want %v", got, err, hd)
	}
	if err := e.a.CloseStdin(e.ctx, hd, id); err != nil {
		t.Errorf("after the outage CloseStdin = %v", err)
	}
	stay.wantExit("exit 0", success)
}

func testDestroyAbsent(t T, h Harness) {
	e := setup(t, h)
	never := adapter.Handle{Provider: e.a.Provider(), Name: e.name(), ID: "never-created"}
	if err := e.a.Destroy(e.ctx, never); err != nil {
		t.Errorf("Destroy(never created) = %v, want nil", err)
	}
	hd := e.create()
	for i := range 2 {
		if err := e.a.Destroy(e.ctx, hd); err != nil {
			t.Errorf("Destroy #%d = %v, want nil", i+1, err)
		}
	}
}

// createMany makes n sandboxes and returns them by name.
func (e *env) createMany(n int) map[string]adapter.Handle {
	e.t.Helper()
	want := map[string]adapter.Handle{}
	for range n {
		hd := e.create()
		want[hd.Name] = hd
	}
	return want
}

func testListPaged(t T, h Harness) {
	e := setup(t, h)
	want := e.createMany(5)
	const size = 2
	seen := map[string]int{}
	token, pages := "", 0
	for {
		pages++
		if pages > 1000 {
			t.Fatalf("listing did not end after 1000 pages of %d", size)
		}
		p, err := e.a.List(e.ctx, adapter.ListOptions{PageToken: token, PageSize: size})
		if err != nil {
			t.Fatalf("List page %d = %v", pages, err)
		}
		if len(p.Handles) > size {
			t.Errorf("List page %d has %d handles, want at most PageSize %d", pages, len(p.Handles), size)
		}
		for _, x := range p.Handles {
			if w, ok := want[x.Name]; ok && !x.Same(w) {
				t.Errorf("List shows %v, want %v", x, w)
			}
			seen[x.Name]++
		}
		if p.NextPageToken == "" {
			break
		}
		if p.NextPageToken == token {
			t.Fatalf("List page %d returned its own token %q again: the listing cannot end", pages, token)
		}
		token = p.NextPageToken
	}
	if pages < 3 {
		t.Errorf("listing of at least 5 sandboxes took %d pages of %d, want at least 3", pages, size)
	}
	for name := range want {
		if seen[name] != 1 {
			t.Errorf("paged listing shows %q %d times, want once", name, seen[name])
		}
	}
	_, err := e.a.List(e.ctx, adapter.ListOptions{PageToken: "not-a-token-this-adapter-issued"})
	if err == nil {
		t.Errorf("List(forged page token) = nil error, want invalid")
	} else if errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("List(forged page token) = %v, want invalid, never not_found", err)
	}
}

func testListInterrupted(t T, h Harness) {
	e := setup(t, h)
	if e.s.InterruptList == nil {
		skipHook(t, "InterruptList")
	}
	want := e.createMany(3)
	e.s.InterruptList()
	hs, err := adapter.ListAll(e.ctx, e.a, 2, 1000)
	if err == nil {
		missing := 0
		for name := range want {
			if !slices.ContainsFunc(hs, func(x adapter.Handle) bool { return x.Name == name }) {
				missing++
			}
		}
		t.Errorf("an interrupted listing succeeded with %d handles (%d of ours missing), want an error: a short set that looks whole makes a reaper act", len(hs), missing)
	} else if errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("interrupted listing = %v, want a transient error, never not_found", err)
	}
	hs, err = adapter.ListAll(e.ctx, e.a, 2, 1000)
	if err != nil {
		t.Fatalf("listing after the interruption = %v", err)
	}
	for name := range want {
		if !slices.ContainsFunc(hs, func(x adapter.Handle) bool { return x.Name == name }) {
			t.Errorf("listing after the interruption misses %q", name)
		}
	}
}

func testExecOK(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.exec(hd, e.fx.ExecOK)
	if !success(r.Exit) {
		t.Errorf("Exec(ExecOK) exit = %v, want exited 0", r.Exit)
	}
	if !strings.Contains(string(r.Stdout), e.fx.ExecOKStdout) {
		t.Errorf("Exec(ExecOK) stdout = %s, want it to contain %q", quoteAll(r.Stdout), e.fx.ExecOKStdout)
	}
}

func testExecExitCode(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.exec(hd, e.fx.ExecFail)
	if !code(3)(r.Exit) {
		t.Errorf("Exec(ExecFail) exit = %+v, want exited with code 3 (blocking path)", r.Exit)
	}
	if r.Exit.Success() {
		t.Errorf("Exec(ExecFail) reads as success: an invented exit 0")
	}
}

func testExecStderr(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.exec(hd, e.fx.Stderr)
	if string(r.Stdout) != e.fx.StderrStdout || string(r.Stderr) != e.fx.StderrStderr {
		t.Errorf("Exec(Stderr) = stdout %s stderr %s, want %q and %q, kept apart", quoteAll(r.Stdout), quoteAll(r.Stderr), e.fx.StderrStdout, e.fx.StderrStderr)
	}
	if !success(r.Exit) {
		t.Errorf("Exec(Stderr) exit = %v, want exited 0", r.Exit)
	}
}

func testExecNeverPanics(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	gone := e.create()
	if err := e.a.Destroy(e.ctx, gone); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	tests := []struct {
		name string
		h    adapter.Handle
		c    adapter.Command
		gone bool
	}{
		{"empty command", hd, adapter.Command{}, false},
		{"missing program", hd, adapter.Command{Path: "conformance-no-such-program-7f3a"}, false},
		{"destroyed sandbox", gone, e.fx.ExecOK, true},
		{"zero handle", adapter.Handle{}, e.fx.ExecOK, false},
	}
	for _, tc := range tests {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("Exec(%s) panicked: %v", tc.name, p)
				}
			}()
			r, err := e.a.Exec(e.ctx, tc.h, tc.c)
			switch {
			case tc.gone:
				e.wantKind("Exec("+tc.name+")", err, adapter.ErrNotFound)
			case err == nil && r.Exit.Success():
				t.Errorf("Exec(%s) = success, want an error or a failing exit", tc.name)
			case err == nil && !r.Exit.Valid():
				t.Errorf("Exec(%s): exit %+v breaks the Exit invariants", tc.name, r.Exit)
			}
		}()
	}
}

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

func testAttach(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.spawn(hd, e.fx.SpawnOK, adapter.SpawnOptions{})
	r.rest()
	id := r.st.SessionID()
	if !e.a.Capabilities().Has(adapter.CapAttach) {
		st, err := e.a.Attach(e.ctx, hd, id, adapter.Cursor{})
		if err == nil {
			_ = st.Close()
		}
		e.wantKind("Attach without the attach capability", err, adapter.ErrNotSupported)
		return
	}
	// Replay from byte zero, twice, live and late: both byte-identical to
	// the spawn's own read.
	for i := range 2 {
		a := e.attach(hd, id, adapter.Cursor{})
		a.wantExit("exit 0", success)
		if !bytes.Equal(a.out[0], r.out[0]) || !bytes.Equal(a.out[1], r.out[1]) {
			t.Errorf("attach #%d from byte zero = %s/%s, want %s/%s", i+1, quoteAll(a.out[0]), quoteAll(a.out[1]), quoteAll(r.out[0]), quoteAll(r.out[1]))
		}
	}
	_, err := e.a.Attach(e.ctx, hd, "conformance-no-such-session", adapter.Cursor{})
	e.wantKind("Attach(unknown session)", err, adapter.ErrNotFound)
	beyond := adapter.Cursor{Stdout: int64(len(r.out[0])) + 1000}
	if st, err := e.a.Attach(e.ctx, hd, id, beyond); err == nil {
		_ = st.Close()
		t.Errorf("Attach(cursor beyond the end) = nil error, want invalid")
	} else {
		e.wantKind("Attach(cursor beyond the end)", err, &adapter.InvalidError{})
	}
}

// testAttachCursors is the replay-cursor acceptance test: a read cut at a
// cursor plus a read from that cursor equal one uninterrupted read, stdout
// and stderr kept apart.
func testAttachCursors(t T, h Harness) {
	e := setup(t, h)
	if !e.a.Capabilities().Has(adapter.CapAttach) {
		t.Skipf("the adapter does not advertise attach; Capability/attach checks that it refuses")
	}
	hd := e.create()
	live := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	id := live.st.SessionID()
	var sent strings.Builder
	sent.WriteString("ready\n")
	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			line := fmt.Sprintf("line %03d %s\n", i, strings.Repeat("x", i%17))
			sent.WriteString(line)
			if err := e.a.WriteStdin(e.ctx, hd, id, []byte(line)); err != nil {
				t.Fatalf("WriteStdin = %v", err)
			}
		}
	}
	write(0, 40)
	// First reader: attach from zero, stop mid-stream, remember the cursor.
	first := e.attach(hd, id, adapter.Cursor{})
	if !first.stdoutHas("line 020") {
		t.Fatalf("first attach stdout = %s, want line 020", quoteAll(first.out[0]))
	}
	cut := adapter.Cursor{Stdout: int64(len(first.out[0])), Stderr: int64(len(first.out[1]))}
	_ = first.st.Close()
	write(40, 80)
	// Second reader: from the cursor, live, to the end.
	second := e.attach(hd, id, cut)
	if !second.stdoutHas("line 079") {
		t.Fatalf("second attach stdout = %s, want line 079", quoteAll(second.out[0]))
	}
	if err := e.a.CloseStdin(e.ctx, hd, id); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	e2 := second.wantExit("exit 0", success)
	live.wantExit("exit 0", success)
	whole := e.attach(hd, id, adapter.Cursor{})
	e3 := whole.wantExit("exit 0", success)
	if e2 != e3 {
		t.Errorf("exit from the cursor read %v, from byte zero %v: want the same", e2, e3)
	}
	joined := append(append([]byte(nil), first.out[0]...), second.out[0]...)
	if !bytes.Equal(joined, whole.out[0]) {
		t.Errorf("read to cursor %d + read from it = %s, want one uninterrupted read %s", cut.Stdout, quoteAll(joined), quoteAll(whole.out[0]))
	}
	if !bytes.Equal(whole.out[0], live.out[0]) {
		t.Errorf("replay from byte zero %s differs from the live read %s", quoteAll(whole.out[0]), quoteAll(live.out[0]))
	}
	if trimNL(string(whole.out[0])) != trimNL(sent.String()) {
		t.Errorf("stdout = %s, want the %d bytes written", quoteAll(whole.out[0]), sent.Len())
	}

	// Both streams, cut at a cursor inside each.
	fx := e.spawn(hd, e.fx.Stderr, adapter.SpawnOptions{})
	fx.wantExit("exit 0", success)
	sid := fx.st.SessionID()
	full := e.attach(hd, sid, adapter.Cursor{})
	full.wantExit("exit 0", success)
	mid := adapter.Cursor{Stdout: int64(len(full.out[0]) / 2), Stderr: int64(len(full.out[1]) / 2)}
	tail := e.attach(hd, sid, mid)
	tail.wantExit("exit 0", success)
	for i, s := range []adapter.StreamName{adapter.Stdout, adapter.Stderr} {
		j := append(append([]byte(nil), full.out[i][:mid.At(s)]...), tail.out[i]...)
		if !bytes.Equal(j, full.out[i]) {
			t.Errorf("%s: head to cursor %d + read from it = %s, want %s", s, mid.At(s), quoteAll(j), quoteAll(full.out[i]))
		}
	}
	if string(full.out[0]) != e.fx.StderrStdout || string(full.out[1]) != e.fx.StderrStderr {
		t.Errorf("replayed stdout %s stderr %s, want %q and %q, kept apart", quoteAll(full.out[0]), quoteAll(full.out[1]), e.fx.StderrStdout, e.fx.StderrStderr)
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

func testSuspend(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	if !e.a.Capabilities().Has(adapter.CapSuspend) {
		e.wantKind("Suspend without the capability", e.a.Suspend(e.ctx, hd), adapter.ErrNotSupported)
		e.wantKind("Resume without the capability", e.a.Resume(e.ctx, hd), adapter.ErrNotSupported)
		return
	}
	e.requireFiles("suspend")
	const path, content = "conformance-park.txt", "written before the park"
	e.writeFile(hd, path, content)
	for i := range 2 {
		if err := e.a.Suspend(e.ctx, hd); err != nil {
			t.Fatalf("Suspend #%d = %v", i+1, err)
		}
	}
	if got, err := e.a.Get(e.ctx, hd.Name); err != nil || !got.Same(hd) {
		t.Errorf("Get of a parked sandbox = %v, %v; want %v", got, err, hd)
	}
	for i := range 2 {
		if err := e.a.Resume(e.ctx, hd); err != nil {
			t.Fatalf("Resume #%d = %v", i+1, err)
		}
	}
	if got := e.readFile(hd, path); got != content {
		t.Errorf("after suspend and resume the file reads %q, want %q (a fresh disk is data loss)", got, content)
	}
}

func testNetworkPolicy(t T, h Harness) {
	e := setup(t, h)
	if !e.a.Capabilities().Has(adapter.CapNetworkPolicy) {
		hd := e.create()
		e.wantKind("SetNetworkPolicy without the capability", e.a.SetNetworkPolicy(e.ctx, hd, adapter.NetworkPolicy{}), adapter.ErrNotSupported)
		_, err := e.a.Create(e.ctx, e.name(), adapter.CreateOptions{NetworkPolicy: &adapter.NetworkPolicy{}})
		e.wantKind("Create with a network policy without the capability", err, adapter.ErrNotSupported)
		return
	}
	if e.fx.Probe == nil || e.fx.ProbeHost == "" {
		t.Skipf("SKIPPED, NOT VERIFIED: the adapter advertises network_policy but the harness supplies no Probe fixture, so allow: [] is unchecked")
	}
	probe := func(hd adapter.Handle) adapter.Exit {
		t.Helper()
		return e.exec(hd, e.fx.Probe(e.fx.ProbeHost)).Exit
	}
	hd := e.create()
	if err := e.a.SetNetworkPolicy(e.ctx, hd, adapter.NetworkPolicy{Allow: []string{e.fx.ProbeHost}}); err != nil {
		t.Fatalf("SetNetworkPolicy(allow %s) = %v", e.fx.ProbeHost, err)
	}
	if ex := probe(hd); !ex.Success() {
		t.Errorf("probe of the allowed host %s: %v, want success", e.fx.ProbeHost, ex)
	}
	if err := e.a.SetNetworkPolicy(e.ctx, hd, adapter.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatalf("SetNetworkPolicy(allow: []) = %v", err)
	}
	if ex := probe(hd); ex.Success() {
		t.Errorf("probe under allow: [] succeeded: an empty allowlist must deny all egress, never be a no-op")
	}
	denied := e.createNamed(e.name(), adapter.CreateOptions{NetworkPolicy: &adapter.NetworkPolicy{}})
	if ex := probe(denied); ex.Success() {
		t.Errorf("probe in a sandbox created with allow: [] succeeded, want denied")
	}
}

func testPublicURL(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	u, err := e.a.PublicURL(e.ctx, hd, 8080)
	if !e.a.Capabilities().Has(adapter.CapPublicURL) {
		e.wantKind(fmt.Sprintf("PublicURL without the capability (returned %q)", u), err, adapter.ErrNotSupported)
		return
	}
	if err != nil {
		// url-or-nothing: a provider may refuse a port nothing listens on,
		// as the caller's mistake (*InvalidError), never as absence; with
		// a listener it must answer a URL.
		e.wantKind("PublicURL(8080) with nothing listening", err, &adapter.InvalidError{})
		if !e.listen(hd, 8080) {
			t.Skipf("PublicURL refused a port nothing listens on, and no listener could be started in the sandbox (python3): the URL's form is not checked")
		}
		if u, err = e.a.PublicURL(e.ctx, hd, 8080); err != nil {
			t.Fatalf("PublicURL(8080) with a listener = %v", err)
		}
	}
	p, perr := url.Parse(u)
	if perr != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" || p.User != nil {
		t.Errorf("PublicURL(8080) = %q, want an absolute http(s) URL with no credential in it", u)
	}
	for _, port := range []int{0, -1, 65536} {
		_, err := e.a.PublicURL(e.ctx, hd, port)
		e.wantKind(fmt.Sprintf("PublicURL(%d)", port), err, &adapter.InvalidError{})
	}
}

// listen starts a TCP listener on port in the sandbox (with python3, if
// it has one) and reports whether it listens. It lives until the sandbox
// is destroyed.
func (e *env) listen(h adapter.Handle, port int) bool {
	e.t.Helper()
	if r, err := e.a.Exec(e.ctx, h, adapter.Command{Path: "sh", Args: []string{"-c", "command -v python3"}}); err != nil || !r.Exit.Success() {
		return false
	}
	script := fmt.Sprintf("import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('0.0.0.0',%d))\ns.listen()\nprint('listening',flush=True)\ntime.sleep(600)\n", port)
	return e.spawn(h, adapter.Command{Path: "python3", Args: []string{"-c", script}}, adapter.SpawnOptions{}).stdoutHas("listening")
}

func testTTY(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	size := &adapter.TTYSize{Rows: 24, Cols: 80}
	if !e.a.Capabilities().Has(adapter.CapTTY) {
		st, err := e.a.Spawn(e.ctx, hd, e.fx.SpawnOK, adapter.SpawnOptions{TTY: size})
		if err == nil {
			_ = st.Close()
		}
		e.wantKind("Spawn with a TTY without the capability", err, adapter.ErrNotSupported)
		r := e.spawn(hd, e.fx.SpawnOK, adapter.SpawnOptions{})
		e.wantKind("Resize without the capability", e.a.Resize(e.ctx, hd, r.st.SessionID(), *size), adapter.ErrNotSupported)
		r.rest()
		return
	}
	r := e.spawn(hd, e.fx.Stderr, adapter.SpawnOptions{TTY: size})
	r.wantExit("exit 0", success)
	if len(r.out[1]) > 0 {
		t.Errorf("TTY session delivered stderr frames %s, want one stream", quoteAll(r.out[1]))
	}
	if len(r.out[0]) == 0 {
		t.Errorf("TTY session delivered no output")
	}
	stay := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{TTY: size})
	if err := e.a.Resize(e.ctx, hd, stay.st.SessionID(), adapter.TTYSize{Rows: 50, Cols: 132}); err != nil {
		t.Errorf("Resize = %v", err)
	}
	pipes := e.spawn(hd, e.fx.SpawnStay, adapter.SpawnOptions{})
	e.wantKind("Resize of a pipes session", e.a.Resize(e.ctx, hd, pipes.st.SessionID(), *size), &adapter.InvalidError{})
	for _, r := range []*reader{stay, pipes} {
		if err := e.a.CloseStdin(e.ctx, hd, r.st.SessionID()); err != nil {
			t.Errorf("CloseStdin = %v", err)
		}
		r.rest()
	}
}

func testCheckpoint(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	if !e.a.Capabilities().Has(adapter.CapCheckpoint) {
		_, err := e.a.Checkpoint(e.ctx, hd)
		e.wantKind("Checkpoint without the capability", err, adapter.ErrNotSupported)
		e.wantKind("Restore without the capability", e.a.Restore(e.ctx, hd, "x"), adapter.ErrNotSupported)
		return
	}
	e.requireFiles("checkpoint")
	const path = "conformance-ckpt.txt"
	e.writeFile(hd, path, "one")
	id, err := e.a.Checkpoint(e.ctx, hd)
	if err != nil || id == "" {
		t.Fatalf("Checkpoint = %q, %v", id, err)
	}
	e.writeFile(hd, path, "two")
	if err := e.a.Restore(e.ctx, hd, id); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	if got := e.readFile(hd, path); got != "one" {
		t.Errorf("after Restore the file reads %q, want %q", got, "one")
	}
	err = e.a.Restore(e.ctx, hd, "conformance-no-such-checkpoint")
	if err == nil || errors.Is(err, adapter.ErrNotFound) {
		t.Errorf("Restore(unknown checkpoint) = %v, want an error that is not not_found", err)
	}
}
