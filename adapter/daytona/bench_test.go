package daytona_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/daytona"
)

// BenchmarkShimCall measures one runner-shim call (a session listing,
// runner-shim list) through the adapter, with each call in a toolbox
// session of its own deleted on the call's path (before: the stand-in's
// DELETE waits for its 100 ms termination check, as the daemon's does)
// and with the session pool (after), beside the stand-in's bare session
// exec (an async `true` in an existing session, polled to its exit code)
// as the baseline of the same run. Figures only mean something on a quiet
// machine:
//
//	go test -run '^$' -bench BenchmarkShimCall -benchtime 100x -count 5 ./adapter/daytona/
func BenchmarkShimCall(b *testing.B) {
	_, c := standIn(b)
	ctx := context.Background()
	sb, err := c.Create(ctx, daytona.CreateSandbox{Name: "bench-bare"})
	if err == nil {
		sb, err = c.WaitState(ctx, sb.ID, daytona.StateStarted)
	}
	if err != nil {
		b.Fatal(err)
	}
	tb, err := c.Toolbox(ctx, sb)
	if err == nil {
		err = tb.CreateSession(ctx, "bare")
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Run("bare-exec", func(b *testing.B) {
		for range b.N {
			r, err := tb.Exec(ctx, "bare", "true", true)
			if err != nil {
				b.Fatal(err)
			}
			for {
				cmd, err := tb.Command(ctx, "bare", r.CmdID)
				if err != nil {
					b.Fatal(err)
				}
				if cmd.ExitCode != nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	})
	for _, bc := range []struct {
		name    string
		perCall bool
	}{{"session-per-call", true}, {"session-pool", false}} {
		b.Run(bc.name, func(b *testing.B) {
			a := newAdapter(b, c, nil)
			daytona.SetPerCallSessions(a, bc.perCall)
			h, err := a.Create(ctx, "bench-"+bc.name, adapter.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := a.Sessions(ctx, h); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if _, err := a.Sessions(ctx, h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
