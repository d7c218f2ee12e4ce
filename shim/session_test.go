package shim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestValidID pins the session-id rule shared with runnerd: 1-64 of
// [A-Za-z0-9._-], starting with a letter or a digit.
func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   string
		ok   bool
	}{
		{"letter", "a", true},
		{"digit", "7", true},
		{"mixed", "Turn-1_a.b", true},
		{"64 bytes", strings.Repeat("a", 64), true},
		{"empty", "", false},
		{"65 bytes", strings.Repeat("a", 65), false},
		{"leading dot", ".warm-1", false},
		{"leading dash", "-rf", false},
		{"leading underscore", "_x", false},
		{"slash", "a/b", false},
		{"space", "a b", false},
		{"non-ascii", "é", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sessiondir.ValidID(tc.id); got != tc.ok {
				t.Fatalf("ValidID(%q) = %v, want %v", tc.id, got, tc.ok)
			}
		})
	}
}

// TestStartRefusesBadID shows Start applies the rule before it starts
// anything: a leading '-' or '_' is refused with ErrInvalid.
func TestStartRefusesBadID(t *testing.T) {
	for _, id := range []string{"-x", "_x", ".x", ""} {
		_, err := shimtest.ColdStart(shimtest.CtxT(t, 10*time.Second), shimtest.ShimExe, shimtest.SessionDir(t), sessiondir.Spec{ID: id, Argv: []string{"true"}, Env: shimtest.TestEnv})
		if !errors.Is(err, sessiondir.ErrInvalid) {
			t.Errorf("id %q: got %v, want ErrInvalid", id, err)
		}
	}
}
