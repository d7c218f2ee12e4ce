package e2b_test

import (
	"bytes"
	"testing"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/hostedtest"
)

// TestWriteStdinOverTheBoundRefused: a write whose runner-shim stdin
// (base64 lines) passes the 64 MiB an exec takes is refused whole
// (*adapter.InvalidError) before anything runs. Cut at 64 MiB instead,
// the 1,023 whole lines before the cut (47.95 MiB) reached the session
// and only the cut line was refused: a failed write that half happened.
func TestWriteStdinOverTheBoundRefused(t *testing.T) {
	_, c := standIn(t)
	ctx := ctxT(t)
	a := newAdapter(t, c, nil)
	h := hostedtest.Create(t, ctx, a, "stdin-bound")
	st, err := a.Spawn(ctx, h, adapter.Shell("wc -c"), adapter.SpawnOptions{SessionID: "count"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = a.WriteStdin(ctx, h, "count", bytes.Repeat([]byte("x"), 48<<20))
	hostedtest.WantKind(t, "WriteStdin of 48 MiB", err, adapter.KindInvalid)
	if err := a.WriteStdin(ctx, h, "count", []byte("after\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(ctx, h, "count"); err != nil {
		t.Fatal(err)
	}
	if got := string(bytes.TrimSpace(hostedtest.ReadToExit(t, st))); got != "6" {
		t.Fatalf("the session read %s bytes, want 6 (the refused write must deliver nothing)", got)
	}
}
