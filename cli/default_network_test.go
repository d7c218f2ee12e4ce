package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentrunner/runner/internal/runnerdtest"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/wire"
)

// publicEgressText is how runner shows runnerd's default policy.
const publicEgressText = "allow * and every public address (private ranges need a policy or runnerd --egress-private allow)"

// TestNetworkText: each kind of policy as a person reads it; the default
// (wire.PublicEgress, 39 entries) in words, in whatever order it comes.
func TestNetworkText(t *testing.T) {
	pub := wire.PublicEgress()
	reversed := slices.Clone(pub)
	slices.Reverse(reversed)
	for _, tc := range []struct {
		name string
		n    *wire.Network
		want string
	}{
		{"host network", nil, "unrestricted (no policy)"},
		{"deny all", &wire.Network{Allow: []string{}}, "all egress denied"},
		{"open", &wire.Network{Allow: []string{"*", "0.0.0.0/0"}}, "allow *, 0.0.0.0/0"},
		{"hosts", &wire.Network{Allow: []string{"api.github.com", "192.0.2.0/24"}}, "allow api.github.com, 192.0.2.0/24"},
		{"public", &wire.Network{Allow: pub}, publicEgressText},
		{"public reversed", &wire.Network{Allow: reversed}, publicEgressText},
		{"public and a private range", &wire.Network{Allow: append(slices.Clone(pub), "10.0.0.0/8")},
			"allow " + strings.Join(pub, ", ") + ", 10.0.0.0/8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := networkText(tc.n); got != tc.want {
				t.Errorf("networkText = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDefaultNetworkShown: against a real root runnerd at its default
// --egress-private, a sandbox created with no options shows its network
// in words in create, get and policy, while get --json carries the whole
// list the kernel holds; a policy that differs by one CIDR is shown as
// the list it is.
func TestDefaultNetworkShown(t *testing.T) {
	testcap.Root(t, "a contained sandbox needs a root runnerd")
	lab := netlab.New(t)
	lab.EgressPrivate = "default"
	netState := t.TempDir()
	t.Cleanup(func() { netlab.UnmountLeftovers(netState) })
	d := runnerdtest.Start(t, filepath.Join(binDir, "runnerd"),
		append(lab.RunnerdArgs(netState), "--cgroups", "off")...)
	t.Cleanup(d.Stop)
	if err := os.Chmod(d.State, 0o711); err != nil {
		t.Fatal(err)
	}
	env := cliEnv("RUNNERD_URL="+d.URL(), "RUNNERD_STATE="+d.State)
	t.Cleanup(func() { runCLIEnv(env, nil, "rm", "net") })

	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := runCLIEnv(env, nil, args...)
		if code != 0 {
			t.Fatalf("runner %s: exit %d, stderr %s", strings.Join(args, " "), code, errOut)
		}
		return string(out)
	}
	if out := run("create", "net"); !strings.Contains(out, "\nnetwork: "+publicEgressText+"\n") {
		t.Errorf("runner create net printed:\n%s\nwant the line network: %s", out, publicEgressText)
	}
	if out := run("get", "net"); !strings.Contains(out, "\nnetwork:     "+publicEgressText+"\n") {
		t.Errorf("runner get net printed:\n%s\nwant the line network:     %s", out, publicEgressText)
	}
	if out, want := run("policy", "net"), "net: "+publicEgressText+"\n"; out != want {
		t.Errorf("runner policy net printed %q, want %q", out, want)
	}
	var sb wire.Sandbox
	if err := json.Unmarshal([]byte(run("get", "net", "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil || !slices.Equal(sb.Network.Allow, wire.PublicEgress()) {
		t.Errorf("runner get net --json: network %v, want the %d entries of wire.PublicEgress", sb.Network, len(wire.PublicEgress()))
	}

	less := wire.PublicEgress()[:38] // the last CIDR dropped
	run(append([]string{"policy", "net"}, less...)...)
	if out, want := run("policy", "net"), "net: allow "+strings.Join(less, ", ")+"\n"; out != want {
		t.Errorf("runner policy net, one CIDR short of the default, printed %q, want %q", out, want)
	}
}
