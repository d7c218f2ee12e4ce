package cli

// runner fork: a new sandbox from a checkpoint of another.

import (
	"context"
	"flag"
	"fmt"

	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands,
		&command{name: "fork", args: "SRC NEW [--checkpoint ID]", min: 2, max: 2,
			short: "make sandbox NEW from a checkpoint of SRC (SRC's disk now by default)",
			long: `NEW's workspace starts as checkpoint ID of sandbox SRC, or, without
--checkpoint, as SRC's disk now (SRC is checkpointed first, its processes
frozen for the capture, and that checkpoint is deleted again). Every file
belongs to NEW's own user, setuid bits cleared. NEW gets the options given
here (--user, limits, --disk, --allow, --deny-all), never SRC's. SRC keeps
running, unchanged; writes in either are invisible to the other. NEW must not
exist (conflict); an unknown SRC or checkpoint is not_found, and a failed
fork leaves no NEW.
Examples:
  runner fork agent-1 agent-1-try
  runner fork agent-1 agent-2 --checkpoint ck-0123456789abcdef --memory 2g`,
			setup: forkCmd},
	)
}

func forkCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	ck := fs.String("checkpoint", "", "fork checkpoint ID of SRC instead of its disk now")
	request := createFlags(fs, "fork")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		src, name := pos[0], pos[1]
		req, err := request(name)
		if err != nil {
			return err
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		defer e.progress("forking " + src + " to " + name)()
		sb, err := c.ForkSandbox(ctx, req, wire.ForkFrom{Sandbox: src, Checkpoint: *ck})
		if err != nil {
			return fail("fork "+src+" to "+name, err)
		}
		if e.g.json {
			return e.printJSON(sb)
		}
		from := src + "'s disk now"
		if *ck != "" {
			from = "checkpoint " + *ck + " of " + src
		}
		fmt.Fprintf(e.io.out, "%s %s (workspace %s), forked from %s\n", sb.Name, sb.State, sb.Workspace, from)
		if sb.Limits != nil {
			fmt.Fprintf(e.io.out, "limits: %s\n", limitsText(*sb.Limits))
		}
		if sb.Network != nil {
			fmt.Fprintf(e.io.out, "network: %s\n", networkText(sb.Network))
		}
		return nil
	}
}
