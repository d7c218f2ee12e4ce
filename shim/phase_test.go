package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/proto"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestStartErrorPhase: only the caller's command's own failures are phase
// exec; a start that fails on the host's side (here a network namespace
// that vanished: ENOENT too) is setup, so runnerd never reports it as the
// caller's mistake.
func TestStartErrorPhase(t *testing.T) {
	tests := []struct {
		name      string
		spec      sessiondir.Spec
		wantPhase string
		wantErrno syscall.Errno
	}{
		{"missing absolute executable", sessiondir.Spec{Argv: []string{"/nonexistent/bin"}}, proto.PhaseExec, syscall.ENOENT},
		{"PATH lookup", sessiondir.Spec{Argv: []string{"no-such-command-xyz"}}, proto.PhaseExec, syscall.ENOENT},
		{"not a program", sessiondir.Spec{Argv: []string{"/etc/hostname"}}, proto.PhaseExec, 0},
		{"missing cwd", sessiondir.Spec{Argv: []string{"true"}, Dir: "/nonexistent/dir"}, proto.PhaseExec, syscall.ENOENT},
		{"unknown run-as user", sessiondir.Spec{Argv: []string{"true"}, User: "no-such-user-xyz"}, proto.PhaseExec, 0},
		{"network namespace gone", sessiondir.Spec{Argv: []string{"true"}, NetNS: "/run/netns/no-such-ns-xyz"}, proto.PhaseSetup, syscall.ENOENT},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec
			spec.ID, spec.Env = fmt.Sprintf("p%d", i), shimtest.TestEnv
			_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), spec)
			var se *launch.StartError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a StartError", err)
			}
			if se.Phase != tt.wantPhase {
				t.Errorf("%v: got phase %q, want %q", err, se.Phase, tt.wantPhase)
			}
			if tt.wantErrno != 0 && se.Errno != tt.wantErrno {
				t.Errorf("%v: got errno %d, want %d", err, se.Errno, tt.wantErrno)
			}
			if se.ShimPID != 0 {
				shimtest.WaitGone(t, se.ShimPID)
			}
		})
	}
}

// TestStartErrorPhaseJournal: a journal that cannot be created (its
// directory is a file) fails the start in phase setup.
func TestStartErrorPhaseJournal(t *testing.T) {
	dir := shimtest.SessionDir(t)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, sessiondir.JournalDir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, dir, sessiondir.Spec{ID: "j", Argv: []string{"true"}, Env: shimtest.TestEnv})
	var se *launch.StartError
	if !errors.As(err, &se) || se.Phase != proto.PhaseSetup {
		t.Fatalf("got %v (%+v), want a StartError in phase setup", err, se)
	}
	shimtest.WaitGone(t, se.ShimPID)
}

func TestParseNsexecReportPhase(t *testing.T) {
	for _, tt := range []struct {
		rep  string
		want string
	}{
		{"error 2 exec exec /x\n", proto.PhaseExec},
		{"error 2 exec chdir /d\n", proto.PhaseExec},
		{"error 2 setup nsexec: resolve /etc/resolv.conf\n", proto.PhaseSetup},
		{"error 0 setup nsexec: read parameters: EOF\n", proto.PhaseSetup},
	} {
		if got := proto.PhaseOf(parseNsexecReport(tt.rep)); got != tt.want {
			t.Errorf("%q: got phase %q, want %q", tt.rep, got, tt.want)
		}
	}
}
