package conformance

// Attach checks: an adapter that advertises attach replays a session's
// output and follows it, resuming from a cursor without loss or repeat;
// one that does not refuses.

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/agentrunner/runner/adapter"
)

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
