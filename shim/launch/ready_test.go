package launch_test

import (
	"errors"
	"io/fs"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/shim/launch"
)

func TestParseReadyError(t *testing.T) {
	tests := []struct {
		name      string
		line      string
		wantPhase string
		wantMsg   string
		wantErrno syscall.Errno
	}{
		{"exec phase", "error 42 2 exec start x: no such file", launch.PhaseExec, "start x: no such file", syscall.ENOENT},
		{"setup phase", "error 42 28 setup create journal: no space", launch.PhaseSetup, "create journal: no space", syscall.ENOSPC},
		{"old format", "error 42 2 start x: no such file", "", "start x: no such file", syscall.ENOENT},
		{"old format, one word", "error 42 0 boom", "", "boom", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := launch.ParseReady(tt.line)
			var se *launch.StartError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a StartError", err)
			}
			if se.Phase != tt.wantPhase || se.Msg != tt.wantMsg || se.Errno != tt.wantErrno || se.ShimPID != 42 {
				t.Errorf("got %+v, want phase %q msg %q errno %d shim 42", *se, tt.wantPhase, tt.wantMsg, tt.wantErrno)
			}
			if tt.wantErrno == syscall.ENOENT && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("got %v, want it to match fs.ErrNotExist", err)
			}
		})
	}
}
