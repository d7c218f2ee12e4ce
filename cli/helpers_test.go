package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// ownDaemon starts a runnerd of the test's own (not the shared one) on a
// fresh state directory, which it returns too; the caller stops it.
func ownDaemon(t *testing.T) (*daemon, string) {
	t.Helper()
	state := t.TempDir()
	d, err := startDaemon(state)
	if err != nil {
		t.Fatal(err)
	}
	return d, state
}

// logsUntil polls runner logs of session id in box every 20 ms until it
// prints exactly want, failing t with fail after deadline.
func (d *daemon) logsUntil(t *testing.T, deadline time.Time, box, id, want, fail string) {
	t.Helper()
	for d.ok(t, "logs", box, id) != want {
		if time.Now().After(deadline) {
			t.Fatal(fail)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startFed starts runner with args against d, its stdin the read end r
// of a pipe the test writes (closed here once runner holds it), its
// output in the returned buffers.
func (d *daemon) startFed(t *testing.T, r *os.File, args ...string) (cmd *exec.Cmd, out, errOut *syncBuffer) {
	t.Helper()
	cmd = d.command(args...)
	out, errOut = new(syncBuffer), new(syncBuffer)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, out, errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	return cmd, out, errOut
}

// command returns runner with args, set to find d on its own (d.env), for
// a test that drives the process itself: feeds it, signals it, or reads
// its output as it comes.
func (d *daemon) command(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(binDir, "runner"), args...)
	cmd.Env = d.env()
	return cmd
}
