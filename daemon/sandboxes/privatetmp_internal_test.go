package sandboxes

import (
	"slices"
	"testing"
)

// TestPrivateTmpTargets: every private directory is used unless it holds
// the state directory, which then stays the host's (the workspaces under
// it would vanish behind a private copy).
func TestPrivateTmpTargets(t *testing.T) {
	for _, tc := range []struct {
		state        string
		kept, shared []string
	}{
		{"/var/lib/runnerd", []string{"/tmp", "/var/tmp", "/dev/shm"}, nil},
		{"/tmp/TestX/001", []string{"/var/tmp", "/dev/shm"}, []string{"/tmp"}},
		{"/tmp", []string{"/var/tmp", "/dev/shm"}, []string{"/tmp"}},
		{"/var/tmp/runnerd", []string{"/tmp", "/dev/shm"}, []string{"/var/tmp"}},
		{"/tmpfoo/runnerd", []string{"/tmp", "/var/tmp", "/dev/shm"}, nil},
	} {
		kept, shared := privateTargets(tc.state)
		var targets []string
		for _, b := range kept {
			targets = append(targets, b.Target)
		}
		if !slices.Equal(targets, tc.kept) || !slices.Equal(shared, tc.shared) {
			t.Errorf("state %s: private %v shared %v, want %v and %v", tc.state, targets, shared, tc.kept, tc.shared)
		}
	}
}
