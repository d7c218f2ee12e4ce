package hostedtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// The live smoke tests' shared steps: each provider's live_test.go
// (off without the provider's credential) runs them against the real API.

// LiveSandbox creates the smoke test's one sandbox, runner-smoke-<UTC
// time>; the caller defers destroy, which reports a failed Destroy.
func LiveSandbox(t *testing.T, ctx context.Context, a adapter.Adapter) (h adapter.Handle, destroy func()) {
	t.Helper()
	name := "runner-smoke-" + strings.ToLower(time.Now().UTC().Format("20060102t150405"))
	h, err := a.Create(ctx, name, adapter.CreateOptions{})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	return h, func() {
		if err := a.Destroy(context.Background(), h); err != nil {
			t.Errorf("Destroy = %v", err)
		}
	}
}

// LiveSession drives one session "smoke" through h's first spawn: stdin
// with a NUL, a real EOF, the whole stream to its exit, an attach from a
// cursor, and a listing of exactly that session.
func LiveSession(t *testing.T, ctx context.Context, a adapter.Adapter, h adapter.Handle) {
	t.Helper()
	st, err := a.Spawn(ctx, h, adapter.Shell("echo ready; cat"), adapter.SpawnOptions{SessionID: "smoke"})
	if err != nil {
		t.Fatalf("Spawn = %v", err)
	}
	defer st.Close()
	if err := a.WriteStdin(ctx, h, "smoke", []byte("a\x00b\n")); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	if err := a.CloseStdin(ctx, h, "smoke"); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	out := ReadToExit(t, st)
	if string(out) != "ready\na\x00b\n" {
		t.Fatalf("stdout %q", out)
	}
	re, err := a.Attach(ctx, h, "smoke", adapter.Cursor{Stdout: 6})
	if err != nil {
		t.Fatalf("Attach = %v", err)
	}
	defer re.Close()
	var tail []byte
	for f := range re.Frames() {
		if f.Terminal() {
			break
		}
		tail = append(tail, f.Data...)
	}
	if string(tail) != "a\x00b\n" {
		t.Fatalf("attach from 6: %q", tail)
	}
	list, err := a.Sessions(ctx, h)
	if err != nil || len(list) != 1 || list[0].ID != "smoke" || list[0].Stdout != 10 {
		t.Fatalf("Sessions = %+v %v", list, err)
	}
}
