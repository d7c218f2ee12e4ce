package guest_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// noStatusExec runs every process for real but never reports its exit
// status (guest.ErrNoStatus), as Sprites does when it closes an exec
// without its exit frame; with dropOutput it loses the output too.
type noStatusExec struct {
	inner      guest.Executor
	dropOutput atomic.Bool
}

func (n *noStatusExec) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, lifetime time.Duration) (int, error) {
	w := stdout
	if n.dropOutput.Load() {
		w = io.Discard
	}
	if _, err := n.inner.Exec(ctx, argv, stdin, w, lifetime); err != nil {
		return -1, err
	}
	return -1, errors.Join(guest.ErrNoStatus, &adapter.UnavailableError{Detail: "test: no exit status", Uncertain: true})
}

// TestNoStatus: with no exit status from the transport, runner-shim's
// answers alone carry every call, and the exit codes of the commands
// (0, 3, 255) arrive exactly from the shim's frames; a call whose answer
// was lost too is an error, never a success or an invented status.
func TestNoStatus(t *testing.T) {
	var ns *noStatusExec
	fx := newGuest(t, func(cfg *guest.Config, l *localExec) {
		ns = &noStatusExec{inner: l}
		cfg.Exec = ns
	})
	ctx := ctxT(t)
	for _, code := range []int{0, 3, 255} {
		r, err := fx.g.Exec(ctx, adapter.Shell("echo hi; exit "+strconv.Itoa(code)))
		if err != nil || string(r.Stdout) != "hi\n" || r.Exit.Code != code || r.Exit.Reason != adapter.ReasonExited {
			t.Fatalf("Exec(exit %d) = %q %v %v, want hi and exit %d", code, r.Stdout, r.Exit, err, code)
		}
	}
	r, err := fx.g.Exec(ctx, adapter.Command{Path: "no-such-program-x"})
	if err != nil || r.Exit.Code != 127 {
		t.Fatalf("Exec of a missing program = %v %v, want exit 127 from spawn's exec_error", r.Exit, err)
	}
	st, err := fx.g.Spawn(ctx, adapter.Shell("read x; echo in:$x; cat; exit 3"), adapter.SpawnOptions{SessionID: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := fx.g.WriteStdin(ctx, "ns", []byte("a\n")); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	if err := fx.g.CloseStdin(ctx, "ns"); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	out, _, end := read(t, st)
	if string(out) != "in:a\n" || end.Exit == nil || end.Exit.Code != 3 {
		t.Fatalf("session: %q %v, want in:a and exit 3", out, end)
	}
	ns.dropOutput.Store(true)
	err = fx.g.CloseStdin(ctx, "ns")
	if err == nil || !errors.Is(err, adapter.ErrUnavailable) {
		t.Fatalf("CloseStdin with neither status nor answer = %v, want unavailable", err)
	}
}
