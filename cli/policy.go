package cli

// runner policy: show or set a sandbox's egress allowlist.

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands,
		&command{name: "policy", args: "NAME [HOST|IP|CIDR... | --deny-all]", min: 1, max: -1,
			short: "show or set a sandbox's egress allowlist",
			long: `With no entries, prints the sandbox's policy. With entries, replaces the
allowlist: host names (example.com, *.example.com), IP addresses or CIDRs.
--deny-all replaces it with nothing: the sandbox can reach nothing.
A host that cannot enforce a policy (needs root and nftables; see runner caps,
network_policy) refuses it with not_supported: a policy is never accepted and
left unenforced.
Examples:
  runner policy web-1                           # show it
  runner policy web-1 api.github.com pypi.org
  runner policy web-1 --deny-all                # deny all egress`,
			setup: policyCmd},
	)
}

// networkText says a sandbox's egress policy for people. runnerd's default
// (wire.PublicEgress: "*" and the 38 CIDRs outside the private ranges) is
// said in words, not as 39 entries; --json and the API keep the list.
func networkText(n *wire.Network) string {
	switch {
	case n == nil:
		return "unrestricted (no policy)"
	case len(n.Allow) == 0:
		return "all egress denied"
	case wire.IsPublicEgress(n.Allow):
		return "allow * and every public address (private ranges need a policy or runnerd --egress-private allow)"
	}
	return "allow " + strings.Join(n.Allow, ", ")
}

func policyCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	denyAll := fs.Bool("deny-all", false, "deny all egress (DNS and raw IPs too)")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		if *denyAll && len(pos) > 1 {
			return usagef("policy", "--deny-all and hosts exclude each other")
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := e.callCtx(ctx)
		defer cancel()
		if !*denyAll && len(pos) == 1 {
			// No hosts: show, never change. Denying all
			// egress is asked for by name (--deny-all).
			sb, err := c.GetSandbox(ctx, pos[0])
			if err != nil {
				return fail("policy "+pos[0], err)
			}
			if e.g.json {
				return e.printJSON(sb)
			}
			fmt.Fprintf(e.io.out, "%s: %s\n", sb.Name, networkText(sb.Network))
			return nil
		}
		allow := append([]string{}, pos[1:]...)
		sb, err := c.SetNetwork(ctx, pos[0], allow)
		if err != nil {
			return failHint("policy "+pos[0], err, kindOf(err) == "not_supported",
				"this runnerd cannot enforce egress policies on this host (network_policy is not in `runner caps`; it needs root and nftables), so it refuses rather than pretend")
		}
		if e.g.json {
			return e.printJSON(sb)
		}
		if len(allow) == 0 {
			fmt.Fprintf(e.io.out, "%s: all egress denied\n", sb.Name)
		} else {
			fmt.Fprintf(e.io.out, "%s: egress allowed only to %s\n", sb.Name, strings.Join(allow, ", "))
		}
		return nil
	}
}
