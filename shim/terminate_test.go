package shim

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// TestTerminatedMarker: the exit record says Terminated exactly when the
// command ended after the terminate op asked it to stop, and Code and
// Signal stay the truth of how it ended. A SIGTERM sent through the signal
// op is not a terminate.
func TestTerminatedMarker(t *testing.T) {
	tests := []struct {
		name   string
		script string
		stop   func(t *testing.T, c *launch.Client) // nil: let the command end
		want   journal.Exit
	}{
		{"terminate, killed by TERM", `echo ready; exec sleep 60`,
			func(t *testing.T, c *launch.Client) { c.Terminate(shimtest.CtxT(t, 10*time.Second), 5*time.Second) },
			journal.Exit{Reason: journal.ReasonSignaled, Signal: 15, Code: 143, Terminated: true}},
		{"terminate, trapped TERM and exited 7", `trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done`,
			func(t *testing.T, c *launch.Client) { c.Terminate(shimtest.CtxT(t, 10*time.Second), 5*time.Second) },
			journal.Exit{Reason: journal.ReasonExited, Code: 7, Terminated: true}},
		{"signal TERM is not a terminate", `echo ready; exec sleep 60`,
			func(t *testing.T, c *launch.Client) {
				if err := c.Signal(shimtest.CtxT(t, 5*time.Second), syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			},
			journal.Exit{Reason: journal.ReasonSignaled, Signal: 15, Code: 143}},
		{"exits on its own", `echo ready; exit 3`, nil, journal.Exit{Reason: journal.ReasonExited, Code: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", tt.script}})
			waitOutput(t, dir, "ready\n")
			if tt.stop != nil {
				tt.stop(t, shimtest.Dial(t, dir))
			}
			e := shimtest.WaitExit(t, dir)
			if e.Reason != tt.want.Reason || e.Code != tt.want.Code || e.Signal != tt.want.Signal || e.Terminated != tt.want.Terminated {
				t.Fatalf("got %+v, want %+v", e, tt.want)
			}
			// Attach's exit frame carries the marker too.
			if we := attachExit(t, dir); we.Terminated != tt.want.Terminated || we.Code != tt.want.Code {
				t.Fatalf("attach exit frame: got %+v, want terminated %v code %d", we, tt.want.Terminated, tt.want.Code)
			}
			// A terminate of the ended session answers the same record and
			// does not mark it after the fact.
			again, err := shimtest.Dial(t, dir).Terminate(shimtest.CtxT(t, 5*time.Second), time.Second)
			if err != nil || again.Terminated != tt.want.Terminated {
				t.Fatalf("terminate after the end: got %+v %v, want terminated %v", again, err, tt.want.Terminated)
			}
		})
	}
}

// TestTerminateDiskFull: a terminate whose command ends but whose exit
// record cannot be written (disk full) answers ErrWriteFailed promptly
// instead of waiting for space; once there is space the record is
// published, terminated.
func TestTerminateDiskFull(t *testing.T) {
	shimtest.NeedRoot(t)
	t.Parallel()
	mnt := tmpfsDir(t, "4m")
	dir := filepath.Join(mnt, "s")
	shimtest.StartAt(t, dir, sessiondir.Spec{Argv: []string{"sh", "-c", `echo ready; read x; echo "bye $x"; exec sleep 60`}, Dir: "/"})
	// The command runs while the disk is full; its exit record (written
	// after the terminate ends it) is what cannot be written.
	waitOutput(t, dir, "ready\n")
	c := shimtest.Dial(t, dir)
	// Without its reserve, as a journal recovered after its writer
	// crashed is: with it, the exit record is written on a full disk
	// (TestFinishFullDisk, daemon's TestDiskFullFlood).
	if err := os.Remove(filepath.Join(dir, sessiondir.JournalDir, journal.ReserveFile)); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, mnt)
	if err := c.WriteStdin(shimtest.CtxT(t, 5*time.Second), []byte("now\n")); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, err := c.Terminate(shimtest.CtxT(t, 20*time.Second), 200*time.Millisecond)
	if !errors.Is(err, sessiondir.ErrWriteFailed) {
		t.Fatalf("terminate on a full disk: got %v, want ErrWriteFailed", err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("terminate took %v to say write_failed", took)
	}
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	e := shimtest.WaitExit(t, dir)
	if !e.Terminated || e.Reason != journal.ReasonSignaled {
		t.Fatalf("exit after space came back: got %+v, want signaled, terminated", e)
	}
}

// attachExit attaches to an ended session from the start and returns its
// exit frame's record.
func attachExit(t *testing.T, dir string) wire.Exit {
	t.Helper()
	var got *wire.Exit
	err := sessiondir.Attach(shimtest.CtxT(t, 10*time.Second), dir, sessiondir.AttachOptions{Heartbeat: -1}, func(b []byte) error {
		f, err := wire.ParseFrame(b)
		if err != nil {
			return err
		}
		if f.Kind == wire.FrameExit {
			e, err := f.Exit()
			if err != nil {
				return err
			}
			got = &e
		}
		return nil
	})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if got == nil {
		t.Fatal("attach ended without an exit frame")
	}
	return *got
}
