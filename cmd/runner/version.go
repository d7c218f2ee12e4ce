package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/agentrunner/runner/version"
)

func init() {
	commands = append(commands, &command{name: "version", args: "", min: 0, max: 0,
		short: "print runner's version and runnerd's; warn when they differ",
		long: `Prints "client: VERSION" (this runner) and "daemon: VERSION" (runnerd's
GET /healthz). When both are known builds and they differ, runner warns on
stderr: the two were built apart and may not agree on the protocol.
runner --version is the same command. The client's line is printed even when
runnerd cannot be reached; runner then exits with the error's code (255).
--json prints {"client": "...", "daemon": "..."} (daemon "" when unreachable).`,
		setup: versionCmd})
}

// versions is `runner version --json`.
type versions struct {
	Client string `json:"client"`
	Daemon string `json:"daemon"`
}

func versionCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return func(ctx context.Context, e *env, _, _ []string) error {
		v := versions{Client: version.String()}
		derr := func() error {
			c, err := e.client()
			if err != nil {
				return err
			}
			ctx, cancel := e.callCtx(ctx)
			defer cancel()
			h, err := c.Health(ctx)
			if err != nil {
				return fail("version: ask runnerd", err)
			}
			v.Daemon = h.Version // "" from a runnerd before /healthz said it
			return nil
		}()
		if e.g.json {
			if err := e.printJSON(v); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(e.io.out, "client: %s\n", v.Client)
			switch {
			case derr != nil:
			case v.Daemon == "":
				fmt.Fprintln(e.io.out, "daemon: unknown (this runnerd does not say its version)")
			default:
				fmt.Fprintf(e.io.out, "daemon: %s\n", v.Daemon)
			}
		}
		if derr != nil {
			return derr
		}
		if version.Skewed(v.Client, v.Daemon) {
			if e.g.json {
				writeJSONWarning(e, fmt.Sprintf("version skew: runner %s, runnerd %s", v.Client, v.Daemon))
			} else {
				fmt.Fprintf(e.io.err, "runner: warning: runner is %s but runnerd is %s: they were built apart and may disagree; install both from one build\n", v.Client, v.Daemon)
			}
		}
		return nil
	}
}
