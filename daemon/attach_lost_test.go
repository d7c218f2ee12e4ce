package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// TestAttachLostSameOnBothPaths: a session whose shim died without an
// exit record ends with the same terminal frame, byte for byte, through
// runnerd's WebSocket attach and through runner-shim's attach
// (sessiondir.Attach), whichever reads it first: one producer
// (sessiondir.EmitFrames) decides, and writes the lost record into the journal
// so the second reader finds it. Before, runner-shim said lost with its
// own detail and wrote nothing, and after runnerd had finished the
// journal it sent an exit frame with reason lost.
func TestAttachLostSameOnBothPaths(t *testing.T) {
	for _, shimFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("runner-shim first %v", shimFirst), func(t *testing.T) {
			state := t.TempDir()
			a := startDaemonIn(t, state, testToken)
			a.createSandbox("box")
			sess := a.spawn("box", wire.CreateSession{ID: "doomed", Argv: []string{"sh", "-c", "echo before; exec sleep 60"}})
			a.attach(ctxFor(t, 10*time.Second), "box", sess.ID, "", func(wire.Frame) bool { return true })
			pids, _ := filepath.Glob(filepath.Join(state, "s", "[^.]*", "shim.pid"))
			if len(pids) != 1 {
				t.Fatalf("shim.pid files: %v", pids)
			}
			dir := filepath.Dir(pids[0])
			var shimPID int
			raw, _ := os.ReadFile(pids[0])
			fmt.Sscan(string(raw), &shimPID)
			// The shim and the command runnerd started for this test die
			// without an exit record.
			syscall.Kill(shimPID, syscall.SIGKILL)
			syscall.Kill(sess.PID, syscall.SIGKILL)
			if err := processGone(shimPID, 5*time.Second); err != nil {
				t.Fatal(err)
			}

			viaShim := func() []byte {
				var last []byte
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := sessiondir.Attach(ctx, dir, sessiondir.AttachOptions{}, func(b []byte) error {
					last = append(last[:0], b...)
					return nil
				})
				if err != nil {
					t.Fatalf("sessiondir.Attach: %v", err)
				}
				return last
			}
			viaDaemon := func() []byte {
				at := a.attach(ctxFor(t, 10*time.Second), "box", "doomed", "", nil)
				if at.terminal == nil {
					t.Fatalf("runnerd attach ended without a terminal frame: %v", at.closeErr)
				}
				if string(at.streams["stdout"]) != "before\n" {
					t.Errorf("runnerd attach stdout %q, want %q", at.streams["stdout"], "before\n")
				}
				b, err := wire.AppendFrame(nil, *at.terminal)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			var first, second []byte
			if shimFirst {
				first, second = viaShim(), viaDaemon()
			} else {
				first, second = viaDaemon(), viaShim()
			}
			f, err := wire.ParseFrame(first)
			if err != nil || f.Kind != wire.FrameLost {
				t.Fatalf("first terminal frame %v (%v), want lost", f.Kind, err)
			}
			if !bytes.Equal(first, second) {
				t.Errorf("terminal frames differ:\n first  %q\n second %q", first, second)
			}
			e, _ := f.Exit()
			if e.Reason != wire.ExitLost || e.Detail != sessiondir.LostDetail || e.Lengths["stdout"] != int64(len("before\n")) {
				t.Errorf("lost record %+v, want reason lost, detail %q, stdout length 7", e, sessiondir.LostDetail)
			}
		})
	}
}
