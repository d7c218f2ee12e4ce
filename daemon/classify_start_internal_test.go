package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// TestClassifyStart: only a failure of the caller's command is invalid;
// the host's failures (even with ENOENT or EACCES) are unavailable, and a
// full disk is write_failed.
func TestClassifyStart(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   wire.Code
	}{
		{"missing executable", &launch.StartError{Msg: "start x: no such file", Errno: syscall.ENOENT, ShimPID: 7, Phase: launch.PhaseExec}, 400, wire.CodeInvalid},
		{"not executable", &launch.StartError{Msg: "start x: permission denied", Errno: syscall.EACCES, ShimPID: 7, Phase: launch.PhaseExec}, 400, wire.CodeInvalid},
		{"exec format error", &launch.StartError{Msg: "start x: exec format error", Errno: syscall.ENOEXEC, ShimPID: 7, Phase: launch.PhaseExec}, 400, wire.CodeInvalid},
		{"exec E2BIG", &launch.StartError{Msg: "start x: argument list too long", Errno: syscall.E2BIG, ShimPID: 7, Phase: launch.PhaseExec}, 400, wire.CodeInvalid},
		{"unknown user", &launch.StartError{Msg: "look up user", ShimPID: 7, Phase: launch.PhaseExec}, 400, wire.CodeInvalid},
		{"fork EAGAIN", &launch.StartError{Msg: "fork/exec x: resource temporarily unavailable", Errno: syscall.EAGAIN, ShimPID: 7, Phase: launch.PhaseSetup}, 503, wire.CodeUnavailable},
		{"netns vanished", &launch.StartError{Msg: "open netns: no such file", Errno: syscall.ENOENT, ShimPID: 7, Phase: launch.PhaseSetup}, 503, wire.CodeUnavailable},
		{"EMFILE", &launch.StartError{Msg: "listen", Errno: syscall.EMFILE, ShimPID: 7, Phase: launch.PhaseSetup}, 503, wire.CodeUnavailable},
		{"socket EACCES", &launch.StartError{Msg: "listen", Errno: syscall.EACCES, ShimPID: 7, Phase: launch.PhaseSetup}, 503, wire.CodeUnavailable},
		{"journal ENOSPC", &launch.StartError{Msg: "create journal", Errno: syscall.ENOSPC, ShimPID: 7, Phase: launch.PhaseSetup}, http.StatusInsufficientStorage, wire.CodeWriteFailed},
		{"spec ENOSPC", fmt.Errorf("start shim: write spec: %w", syscall.ENOSPC), http.StatusInsufficientStorage, wire.CodeWriteFailed},
		{"shim crashed", &launch.StartError{Msg: "start shim: it exited without reporting"}, 503, wire.CodeUnavailable},
		{"shim binary missing", &launch.StartError{Msg: "start shim /x: no such file", Phase: launch.PhaseSetup}, 503, wire.CodeUnavailable},
		{"old shim, no phase", &launch.StartError{Msg: "start x: no such file", Errno: syscall.ENOENT, ShimPID: 7}, 503, wire.CodeUnavailable},
		{"plain ENOENT", fmt.Errorf("start shim: %w", syscall.ENOENT), 503, wire.CodeUnavailable},
		{"deadline", fmt.Errorf("start shim: wait for ready: %w", context.DeadlineExceeded), 503, wire.CodeUnavailable},
		{"invalid spec", fmt.Errorf("start shim: %w: bad", sessiondir.ErrInvalid), 400, wire.CodeInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ae *apierr.Error
			if !errors.As(sessions.ClassifyStart(tt.err), &ae) {
				t.Fatalf("got no apierr.Error")
			}
			if ae.Status != tt.wantStatus || ae.Code != tt.wantCode {
				t.Errorf("got %d %s, want %d %s", ae.Status, ae.Code, tt.wantStatus, tt.wantCode)
			}
		})
	}
}

// TestClassifyStartExecError: a missing executable (ENOENT) and one that
// cannot be run (EACCES, ENOEXEC), in the exec phase only, carry
// exec_error in the error body, so that a client can exit 127 or 126; the
// same errnos in the setup phase, and other exec-phase errnos, do not.
func TestClassifyStartExecError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want wire.ExecError
	}{
		{"ENOENT exec", &launch.StartError{Errno: syscall.ENOENT, ShimPID: 7, Phase: launch.PhaseExec}, wire.ExecErrorNotFound},
		{"EACCES exec", &launch.StartError{Errno: syscall.EACCES, ShimPID: 7, Phase: launch.PhaseExec}, wire.ExecErrorNotExecutable},
		{"ENOEXEC exec", &launch.StartError{Errno: syscall.ENOEXEC, ShimPID: 7, Phase: launch.PhaseExec}, wire.ExecErrorNotExecutable},
		{"EISDIR exec", &launch.StartError{Errno: syscall.EISDIR, ShimPID: 7, Phase: launch.PhaseExec}, wire.ExecErrorNotExecutable},
		{"E2BIG exec", &launch.StartError{Errno: syscall.E2BIG, ShimPID: 7, Phase: launch.PhaseExec}, ""},
		{"unknown user", &launch.StartError{ShimPID: 7, Phase: launch.PhaseExec}, ""},
		{"ENOENT setup", &launch.StartError{Errno: syscall.ENOENT, ShimPID: 7, Phase: launch.PhaseSetup}, ""},
		{"EACCES setup", &launch.StartError{Errno: syscall.EACCES, ShimPID: 7, Phase: launch.PhaseSetup}, ""},
		{"ENOENT old shim", &launch.StartError{Errno: syscall.ENOENT, ShimPID: 7}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &server{metrics: newMetrics(""), log: slog.New(slog.DiscardHandler)}
			rec := httptest.NewRecorder()
			s.writeError(rec, httptest.NewRequest(http.MethodPost, "/v1/sandboxes/x/exec", nil), sessions.ClassifyStart(tt.err))
			var body wire.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("decode %q: %v", rec.Body.String(), err)
			}
			if body.Error.ExecError != tt.want {
				t.Errorf("exec_error: got %q, want %q (body %s)", body.Error.ExecError, tt.want, rec.Body.String())
			}
			if tt.want != "" && (rec.Code != 400 || body.Error.Code != wire.CodeInvalid) {
				t.Errorf("got %d %s, want 400 invalid", rec.Code, body.Error.Code)
			}
		})
	}
}
