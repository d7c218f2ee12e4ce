package cli

import (
	"strings"
	"testing"

	"github.com/agentrunner/runner/wire"
)

// TestCheckpointCommandsRefusedWithoutCgroups: the shared runnerd runs
// with --cgroups off, so it cannot freeze a sandbox and does not
// advertise checkpoints; the three commands say not_supported, exit with
// its status, and print nothing on stdout.
func TestCheckpointCommandsRefusedWithoutCgroups(t *testing.T) {
	d := sharedDaemon(t)
	name := d.sandbox(t, "ckpt-cli")
	for _, args := range [][]string{{"checkpoint", name, "-m", "x"}, {"checkpoints", name}, {"restore", name, "ck-0000000000000000"}} {
		out, errOut, code := d.cli(t, nil, args...)
		if code != wire.RunnerExitNotSupported || out != "" || !strings.Contains(errOut, "not_supported") {
			t.Errorf("runner %v: exit %d, stdout %q, stderr %q; want %d, nothing, not_supported", args, code, out, errOut, wire.RunnerExitNotSupported)
		}
	}
}
