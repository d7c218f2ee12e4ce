package cli

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/ostest"
	"github.com/agentrunner/runner/wire"
)

// TestStdinInFlightAcrossKill: runnerd is killed (-9) while runner's
// stdin write is inside it (the command does not read yet, so the
// write waits on a full pipe, part of it delivered), and restarted.
// runner sends the same bytes at the same offset again, the shim skips
// what the command already got, and the command reads every byte of
// runner's stdin exactly once, in order: its byte count and sha256sum are the input's.
// Before offsets, the write cut in flight was not sent again ("input
// may not have reached the session"): the command missed the rest of it.
func TestStdinInFlightAcrossKill(t *testing.T) {
	d, state := ownDaemon(t)
	d.ok(t, "create", "kill-box")
	in := make([]byte, 300<<10)
	rand.Read(in)
	sum := sha256.Sum256(in)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// The command reads its stdin only once the file "go" exists.
	cmd, out, errOut := d.startFed(t, r, "exec", "kill-box", "-i", "--",
		"sh", "-c", "while [ ! -e go ]; do sleep 0.05; done; cat > got; wc -c < got; sha256sum < got")
	// A first small write, delivered alone, puts the pipe off the
	// chunks' alignment: the write that meets the full pipe is then
	// delivered in part when runnerd dies (the case offsets are for).
	if _, err := w.Write(in[:1000]); err != nil {
		t.Fatal(err)
	}
	pid := commandPID(t, d, "kill-box")
	waitPipe(t, pid, func(n int) bool { return n == 1000 })
	wrote := make(chan error, 1)
	go func() { _, err := w.Write(in[1000:]); wrote <- err }() // runner queues up to 1 MiB

	// The pipe (64 KiB) fills and a write waits inside runnerd.
	waitPipe(t, pid, func(n int) bool { return n > 1000 })
	for last := 0; ; time.Sleep(300 * time.Millisecond) { // until it stops growing
		n := pipeHolds(t, pid)
		if n == last {
			break
		}
		last = n
	}
	_ = d.cmd.Process.Kill()
	<-d.done
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	w.Close()
	time.Sleep(300 * time.Millisecond)
	d2, err := startDaemon(state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d2.stop)
	d2.ok(t, "exec", "kill-box", "--", "touch", "go")
	waitBounded(t, cmd)
	want := fmt.Sprintf("%d\n%s  -\n", len(in), hex.EncodeToString(sum[:]))
	if got := out.String(); got != want || cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("exec -i across runnerd's kill -9 mid-write: stdout %q exit %d, want %q exit 0 (each byte once, in order); stderr %q",
			got, cmd.ProcessState.ExitCode(), want, errOut.String())
	}
	if e := errOut.String(); strings.Contains(e, "reach the session") || !strings.Contains(e, "input is kept and sent once it is back") {
		t.Errorf("stderr %q: want the kept-input notice, and no input reported lost", e)
	}
}

// commandPID is the pid of the only session of sandbox box, once it has
// one.
func commandPID(t *testing.T, d *daemon, box string) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ss := decode[[]wire.Session](t, d.ok(t, "sessions", box, "--json"))
		if len(ss) == 1 && ss[0].PID > 0 {
			return ss[0].PID
		}
	}
	t.Fatalf("no running session in %s", box)
	return 0
}

// pipeHolds is how many bytes wait in the stdin pipe of process pid.
var pipeHolds = ostest.PipeHolds

// waitPipe waits until what the stdin pipe of pid holds satisfies ok.
func waitPipe(t *testing.T, pid int, ok func(int) bool) {
	t.Helper()
	n := 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n = pipeHolds(t, pid); ok(n) {
			return
		}
	}
	t.Fatalf("the command's stdin pipe holds %d bytes", n)
}
