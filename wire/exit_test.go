package wire

import "testing"

// TestShimExitAgreesWithRunner: where runner and runner-shim report the
// same end, they exit with the same status (issue #17: they had 254 and
// 255 the other way round), and 126/127 are the shell's.
func TestShimExitAgreesWithRunner(t *testing.T) {
	tests := []struct {
		name      string
		got, want int
	}{
		{"lost", ShimTextExitLost, RunnerExitLost},
		{"error frame is outcome unknown", ShimTextExitError, RunnerExitUnavailable},
		{"lost is 254", RunnerExitLost, 254},
		{"unavailable is 255", RunnerExitUnavailable, 255},
		{"not executable", RunnerExitNotExecutable, 126},
		{"command not found", RunnerExitCommandNotFound, 127},
		{"usage", ShimExitUsage, RunnerExitUsage},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %d, want %d", tt.name, tt.got, tt.want)
		}
	}
	row, _ := RowOf(CodeLost)
	if row.Exit != ShimTextExitLost {
		t.Errorf("lost: runner exits %d, runner-shim attach --text %d", row.Exit, ShimTextExitLost)
	}
}
