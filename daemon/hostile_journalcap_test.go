package daemon_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/wire"
)

// TestHostileJournalCap: a sandbox's sessions together store at most
// --sandbox-journal-bytes of output. A command in A that writes past it
// (two at once, so the cap is shared) is ended, its exit naming the cap
// and counting what was not stored, and every byte stored before is
// readable; a create in A then collects the oldest ended sessions to
// make room, while a create in C whose cap a running session holds is
// 409 invalid (journal_cap) until it ends; B is unaffected throughout.
func TestHostileJournalCap(t *testing.T) {
	needV1Cgroups(t)
	const capBytes = 1 << 20
	a, _ := startProcess(t, t.TempDir(), "--sandbox-journal-bytes", "1M")
	a.createSandbox("a")
	a.createSandbox("b")

	// Two writers at once: each alone would fit under 1 MiB, together not.
	var ids []string
	for _, n := range []string{"w1", "w2"} {
		s := a.spawn("a", wire.CreateSession{ID: n, Argv: []string{"sh", "-c", "head -c 800000 /dev/zero; sleep 0.5; head -c 800000 /dev/zero"}})
		ids = append(ids, s.ID)
	}
	bAnswers(t, a, "b", "writers in a")
	var total int64
	capped := 0
	for _, id := range ids {
		got := a.attach(t.Context(), "a", id, "", nil)
		if got.terminal == nil {
			t.Fatalf("session %s: no exit", id)
		}
		e := got.exit
		out := got.streams["stdout"]
		if int64(len(out)) != e.Lengths["stdout"] || !bytes.Equal(out, make([]byte, len(out))) {
			t.Fatalf("session %s: read %d bytes, exit says %d", id, len(out), e.Lengths["stdout"])
		}
		total += int64(len(out))
		if strings.Contains(e.Detail, "journal cap") {
			capped++
			if !e.Terminated || e.UnstoredBytes == 0 || e.Cause != wire.ExitCauseDiskBudget {
				t.Fatalf("session %s ended by the cap: exit %+v, want terminated with unstored bytes, cause %s", id, e, wire.ExitCauseDiskBudget)
			}
		}
		t.Logf("session %s: %d bytes stored, exit %+v", id, len(out), e)
	}
	if total > capBytes || capped == 0 {
		t.Fatalf("sessions of a stored %d bytes (cap %d), %d ended by the cap: want at most the cap and at least one ended", total, capBytes, capped)
	}

	// At the cap with only ended sessions: a create collects the oldest
	// (their journals are what makes room) and starts.
	r := a.do("POST", "/v1/sandboxes/a/sessions", wire.CreateSession{ID: "after", Argv: []string{"true"}})
	if r.status != 201 {
		t.Fatalf("create in a whose cap is held by ended sessions: %d %s, want 201 (the oldest collected)", r.status, r.body)
	}
	if total == capBytes {
		// The oldest whose shim had exited went (a shim lingers a moment
		// after its exit record): one of the two at least.
		collected := 0
		for _, id := range ids {
			if g := a.do("GET", "/v1/sandboxes/a/sessions/"+id, nil); g.status == 404 {
				collected++
			} else if g.status != 200 {
				t.Fatalf("ended session %s after a create at the cap: %d %s", id, g.status, g.body)
			}
		}
		if collected == 0 {
			t.Fatalf("a create at the cap started and collected neither of %v: want the oldest collected", ids)
		}
	}
	bAnswers(t, a, "b", "a at its journal cap")

	// A running session holding the cap is never collected: a create is
	// refused, 409 invalid journal_cap, until it ends.
	a.createSandbox("c")
	a.spawn("c", wire.CreateSession{ID: "holder", Argv: []string{"sh", "-c", "head -c 1048571 /dev/zero; echo full >&2; exec sleep 600"}})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ss wire.Session
		a.must("GET", "/v1/sandboxes/c/sessions/holder", nil, 200, &ss)
		if ss.Lengths["stderr"] == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c's holder did not fill the cap in 20s: %+v", ss)
		}
	}
	r = a.do("POST", "/v1/sandboxes/c/sessions", wire.CreateSession{Argv: []string{"true"}})
	if r.status != 409 || r.code() != wire.CodeInvalid || !strings.HasPrefix(r.errBody(t).Detail, wire.DetailJournalCap+": ") {
		t.Fatalf("create in c whose cap a running session holds: %d %s, want 409 invalid journal_cap", r.status, r.body)
	}
	if g := a.do("GET", "/v1/sandboxes/c/sessions/holder", nil); g.status != 200 {
		t.Fatalf("running holder after a refused create: %d %s, want 200 (never collected)", g.status, g.body)
	}
	bAnswers(t, a, "b", "c at its journal cap")
	a.must("POST", "/v1/sandboxes/c/sessions/holder/terminate", nil, 200, nil)
	res := a.exec("c", wire.Exec{Argv: []string{"sh", "-c", "head -c 1000 /dev/zero"}, TimeoutMS: 20000})
	if res.Exit.Code != 0 || len(res.Stdout) != 1000 {
		t.Fatalf("exec in c after its holder ended: %+v, %d bytes", res.Exit, len(res.Stdout))
	}
}
