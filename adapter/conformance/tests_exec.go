package conformance

// Exec checks: a command runs to completion with its stdout, stderr and
// exit code, and no input makes Exec panic.

import (
	"strings"

	"github.com/agentrunner/runner/adapter"
)

func testExecOK(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.exec(hd, e.fx.ExecOK)
	if !success(r.Exit) {
		t.Errorf("Exec(ExecOK) exit = %v, want exited 0", r.Exit)
	}
	if !strings.Contains(string(r.Stdout), e.fx.ExecOKStdout) {
		t.Errorf("Exec(ExecOK) stdout = %s, want it to contain %q", quoteAll(r.Stdout), e.fx.ExecOKStdout)
	}
}

func testExecExitCode(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.exec(hd, e.fx.ExecFail)
	if !code(3)(r.Exit) {
		t.Errorf("Exec(ExecFail) exit = %+v, want exited with code 3 (blocking path)", r.Exit)
	}
	if r.Exit.Success() {
		t.Errorf("Exec(ExecFail) reads as success: an invented exit 0")
	}
}

func testExecStderr(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	r := e.exec(hd, e.fx.Stderr)
	if string(r.Stdout) != e.fx.StderrStdout || string(r.Stderr) != e.fx.StderrStderr {
		t.Errorf("Exec(Stderr) = stdout %s stderr %s, want %q and %q, kept apart", quoteAll(r.Stdout), quoteAll(r.Stderr), e.fx.StderrStdout, e.fx.StderrStderr)
	}
	if !success(r.Exit) {
		t.Errorf("Exec(Stderr) exit = %v, want exited 0", r.Exit)
	}
}

func testExecNeverPanics(t T, h Harness) {
	e := setup(t, h)
	hd := e.create()
	gone := e.create()
	if err := e.a.Destroy(e.ctx, gone); err != nil {
		t.Fatalf("Destroy = %v", err)
	}
	tests := []struct {
		name string
		h    adapter.Handle
		c    adapter.Command
		gone bool
	}{
		{"empty command", hd, adapter.Command{}, false},
		{"missing program", hd, adapter.Command{Path: "conformance-no-such-program-7f3a"}, false},
		{"destroyed sandbox", gone, e.fx.ExecOK, true},
		{"zero handle", adapter.Handle{}, e.fx.ExecOK, false},
	}
	for _, tc := range tests {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("Exec(%s) panicked: %v", tc.name, p)
				}
			}()
			r, err := e.a.Exec(e.ctx, tc.h, tc.c)
			switch {
			case tc.gone:
				e.wantKind("Exec("+tc.name+")", err, adapter.ErrNotFound)
			case err == nil && r.Exit.Success():
				t.Errorf("Exec(%s) = success, want an error or a failing exit", tc.name)
			case err == nil && !r.Exit.Valid():
				t.Errorf("Exec(%s): exit %+v breaks the Exit invariants", tc.name, r.Exit)
			}
		}()
	}
}
