package shim

import (
	"context"
	"os"
	"testing"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
)

// openGate opens the fifo a test command blocks on before it reads
// stdin, and writes the newline that lets it go on.
func openGate(t *testing.T, fifo string) {
	t.Helper()
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("\n"))
	w.Close()
}

// closeToExit closes the session's stdin, waits for its command to exit
// 0 and returns what the command wrote to stdout.
func closeToExit(t *testing.T, ctx context.Context, c *launch.Client, dir string) []byte {
	t.Helper()
	if err := c.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if ex := shimtest.WaitExit(t, dir); ex.Code != 0 {
		t.Fatalf("exit %+v, want 0", ex)
	}
	got, err := shimtest.ReadStream(dir, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	return got
}
