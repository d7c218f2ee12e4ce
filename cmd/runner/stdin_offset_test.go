package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStdinInFlightAcrossKill: runnerd is killed (-9) while runner's
// stdin write is inside it (the command does not read yet, so the
// write waits on a full pipe, part of it delivered), and restarted.
// runner sends the same bytes at the same offset again, the shim skips
// what the command already got, and the command reads every byte of
// runner's stdin exactly once, in order: its sha256sum is the input's.
// Before offsets, the write cut in flight was not sent again ("input
// may not have reached the session"): the command missed the rest of it.
func TestStdinInFlightAcrossKill(t *testing.T) {
	state := t.TempDir()
	d, err := startDaemon(state)
	if err != nil {
		t.Fatal(err)
	}
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
	cmd := exec.Command(filepath.Join(binDir, "runner"), "exec", "kill-box", "-i", "--",
		"sh", "-c", "while [ ! -e go ]; do sleep 0.05; done; exec sha256sum")
	cmd.Env = d.env()
	var out, errOut syncBuffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	// A first small write, delivered alone, puts the pipe off the
	// chunks' alignment: the write that meets the full pipe is then
	// delivered in part when runnerd dies (the case offsets are for).
	if _, err := w.Write(in[:1000]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	wrote := make(chan error, 1)
	go func() { _, err := w.Write(in[1000:]); wrote <- err }() // runner queues up to 1 MiB

	// The pipe (64 KiB) fills and a write waits inside runnerd.
	time.Sleep(2 * time.Second)
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
	want := hex.EncodeToString(sum[:]) + "  -\n"
	if got := out.String(); got != want || cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("exec -i across runnerd's kill -9 mid-write: stdout %q exit %d, want %q exit 0 (each byte once, in order); stderr %q",
			got, cmd.ProcessState.ExitCode(), want, errOut.String())
	}
	if e := errOut.String(); strings.Contains(e, "reach the session") || !strings.Contains(e, "input is kept and sent once it is back") {
		t.Errorf("stderr %q: want the kept-input notice, and no input reported lost", e)
	}
}
