package sessions

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/wire"
)

// TestStdinWaitsForCommitsOfAStartingRecord forces the interleaving behind
// a TestStdinLooksUpSessionFirst flake under load: an exec is answered with
// its "running" commit (spawn) and its exit commit both pending, so a stdin
// write that follows reads a record still starting. stdinSession must wait
// for those commits and answer command_exited, not take the session as
// live (its handler would then read, and refuse, an oversized body).
//
// A gate commit, blocked inside the registry's update, holds the
// registry's single writer, so the real recordRunning and recordExitLater
// commits queue behind it and the record says starting until it opens.
func TestStdinWaitsForCommitsOfAStartingRecord(t *testing.T) {
	d, reg, ss := newCommitsHarness(t)
	defer d.close()
	s := &Manager{reg: reg, commits: d, log: slog.New(slog.DiscardHandler), metrics: &tallies{}}

	release := make(chan struct{})
	d.commit(ss, "gate", func(*registry.Session) { <-release })
	spawned := ss
	spawned.State, spawned.PID = wire.SessionRunning, 4242
	s.recordRunning(spawned)
	s.RecordExitLater(spawned, wire.Exit{Reason: wire.ExitExited, Code: 0, Time: time.Now().UTC()})
	if got := stateOf(t, reg, ss); got != StateStarting {
		t.Fatalf("record before the commits landed: got %q, want %q", got, StateStarting)
	}

	type result struct {
		ss  registry.Session
		err error
	}
	answered := make(chan result, 1)
	go func() {
		ss, err := s.StdinSession(context.Background(), ss.Sandbox, ss.ID)
		answered <- result{ss, err}
	}()
	select {
	case r := <-answered:
		close(release)
		t.Fatalf("stdinSession answered with the session's commits pending: state %q, err %v; want it to wait for them", r.ss.State, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	r := <-answered
	var ae *apierr.Error
	if !errors.As(r.err, &ae) || ae.Code != wire.CodeCommandExited {
		t.Fatalf("stdinSession after the commits landed: got err %v, want %s", r.err, wire.CodeCommandExited)
	}
	if r.ss.State != wire.SessionExited || r.ss.Exit == nil || r.ss.Exit.Reason != wire.ExitExited {
		t.Errorf("session returned: state %q exit %+v, want %q with its exit record", r.ss.State, r.ss.Exit, wire.SessionExited)
	}
}
