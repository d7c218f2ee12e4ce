package guest_test

import (
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
)

// TestCloseWithUnreadAttach: Close returns while an attach's output is
// not being read. The attach execution writes into a pipe nobody reads any
// more; without closing the pipe's read side on cancel, its write (and so
// the execution, and Close waiting for it) blocked forever.
func TestCloseWithUnreadAttach(t *testing.T) {
	fx := newGuest(t, nil)
	ctx := ctxT(t)
	st, err := fx.g.Spawn(ctx, adapter.Shell(`head -c 8000000 /dev/zero | tr '\0' x; sleep 60`), adapter.SpawnOptions{SessionID: "flood"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	time.Sleep(time.Second) // the stream's buffer and the pipe fill; nobody reads
	done := make(chan struct{})
	go func() { fx.g.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return with an unread attach: its execution is stuck writing to the pipe")
	}
}
