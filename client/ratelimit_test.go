package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/internal/ostest"
	"github.com/agentrunner/runner/wire"
)

// TestExecRateLimited: with --max-execs 1 and one exec in flight, a second
// exec through the client fails as *adapter.RateLimitedError carrying
// runnerd's delay, and runs once the first is done.
func TestExecRateLimited(t *testing.T) {
	d := startDaemon(t, "--netpolicy", "off", "--max-execs", "1")
	ctx := context.Background()
	c := newClient(t, d, d.url())
	sb, err := c.CreateSandbox(ctx, wire.CreateSandbox{Name: "limited"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSandbox(ctx, sb.Name)

	held := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, sb.Name, wire.Exec{Argv: []string{"sh", "-c", "touch started; while [ ! -e release ]; do sleep 0.05; done"}})
		held <- err
	}()
	release := func() {
		if err := os.WriteFile(filepath.Join(sb.WorkspaceOnHost(), "release"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := <-held; err != nil {
			t.Errorf("held exec: %v", err)
		}
	}
	ostest.WaitFile(t, filepath.Join(sb.WorkspaceOnHost(), "started"), 20*time.Second, release, "the held exec never started")

	_, err = c.Exec(ctx, sb.Name, wire.Exec{Argv: []string{"true"}})
	var rl *adapter.RateLimitedError
	if !errors.As(err, &rl) {
		release()
		t.Fatalf("second exec: got %v (%T), want *adapter.RateLimitedError", err, err)
	}
	if rl.RetryAfter != time.Second {
		t.Errorf("RetryAfter: got %v, want 1s", rl.RetryAfter)
	}
	release()
	if res, err := c.Exec(ctx, sb.Name, wire.Exec{Argv: []string{"echo", "ok"}}); err != nil || string(res.Stdout) != "ok\n" {
		t.Errorf("exec after release: got %q, %v; want \"ok\\n\"", res.Stdout, err)
	}
}
