package cli

import (
	"strings"
	"testing"
)

// TestNotSupportedHints: a refusal of a capability the shared runnerd does
// not hold (it runs --netpolicy off and --cgroups off) ends in the hint
// that names the capability, exactly, after runnerd's own error line.
func TestNotSupportedHints(t *testing.T) {
	d := sharedDaemon(t)
	box := d.sandbox(t, "hint-ns")
	for _, tc := range []struct {
		args []string
		head string
		hint string
	}{
		{[]string{"policy", box, "--deny-all"}, "runner: policy hint-ns: not_supported: ",
			"runner: hint: this runnerd cannot enforce egress policies on this host (network_policy is not in `runner caps`; it needs root and nftables), so it refuses rather than pretend\n"},
		{[]string{"limits", box, "--memory", "64m"}, "runner: limits hint-ns: not_supported: ",
			"runner: hint: this runnerd does not enforce limits here (resource_limits is not in `runner caps`)\n"},
	} {
		out, errOut, code := d.cli(t, nil, tc.args...)
		if code != exitNotSupported || out != "" || !strings.HasPrefix(errOut, tc.head) || !strings.HasSuffix(errOut, tc.hint) || strings.Count(errOut, "\n") != 2 {
			t.Errorf("runner %v: exit %d stdout %q stderr %q; want %d, nothing, %q ... %q", tc.args, code, out, errOut, exitNotSupported, tc.head, tc.hint)
		}
	}
}
