package daemon_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestHostileJournalCap: a sandbox's sessions together store at most
// --sandbox-journal-bytes of output. A command in A that writes past it
// (two at once, so the cap is shared) is ended, its exit naming the cap
// and counting what was not stored, and every byte stored before is
// readable; a create in A is then 409 invalid (journal_cap) until a
// session is deleted; B is unaffected throughout.
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
			if !e.Terminated || e.UnstoredBytes == 0 {
				t.Fatalf("session %s ended by the cap: exit %+v, want terminated with unstored bytes", id, e)
			}
		}
		t.Logf("session %s: %d bytes stored, exit %+v", id, len(out), e)
	}
	if total > capBytes || capped == 0 {
		t.Fatalf("sessions of a stored %d bytes (cap %d), %d ended by the cap: want at most the cap and at least one ended", total, capBytes, capped)
	}

	r := a.do("POST", "/v1/sandboxes/a/sessions", wire.CreateSession{Argv: []string{"true"}})
	if total == capBytes {
		if r.status != 409 || r.code() != wire.CodeInvalid || !strings.HasPrefix(r.errBody(t).Detail, wire.DetailJournalCap+": ") {
			t.Fatalf("create in a at its journal cap: %d %s, want 409 invalid journal_cap", r.status, r.body)
		}
	}
	t.Logf("create at the cap: %d %s", r.status, r.body)
	bAnswers(t, a, "b", "a at its journal cap")
	// A re-create of an existing id is answered as before.
	a.must("POST", "/v1/sandboxes/a/sessions", wire.CreateSession{ID: "w1", Argv: []string{"sh", "-c", "head -c 800000 /dev/zero; sleep 0.5; head -c 800000 /dev/zero"}}, 200, nil)
	// Deleting the sessions frees their bytes.
	for _, id := range ids {
		a.must("DELETE", "/v1/sandboxes/a/sessions/"+id, nil, 204, nil)
	}
	res := a.exec("a", wire.Exec{Argv: []string{"sh", "-c", "head -c 1000 /dev/zero"}, TimeoutMS: 20000})
	if res.Exit.Code != 0 || len(res.Stdout) != 1000 {
		t.Fatalf("exec in a after the deletes: %+v, %d bytes", res.Exit, len(res.Stdout))
	}
}
