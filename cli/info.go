package cli

// What runner talks to: version (runner's and runnerd's), info and caps.

import (
	"context"
	"flag"
	"fmt"
	"strings"

	units "github.com/docker/go-units"

	"github.com/agentrunner/runner/client"
	"github.com/agentrunner/runner/version"
	"github.com/agentrunner/runner/wire"
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

func init() {
	commands = append(commands, &command{name: "info", args: "", min: 0, max: 0,
		short: "show what this runnerd is and holds (docker info for runnerd)",
		long: `Prints runnerd's version (and runner's), its capabilities, the sandboxes and
running sessions it holds against its bounds, its state directory, how it
enforces resource limits (cgroups v1, v2, or off), which sandboxes it isolates
(contained, all, or off when it is not root) and its warm shim pool: GET
/v1/info. --json prints that object (docs/protocol.md, "GET /v1/info").`,
		setup: infoCmd})
}

func infoCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return withClient(func(ctx context.Context, e *env, c *client.Client, _ []string) error {
		in, err := c.Info(ctx)
		if err != nil {
			return fail("info", err)
		}
		if e.g.json {
			return e.printJSON(in)
		}
		bound := func(n, max int) string {
			if max == 0 {
				return fmt.Sprint(n)
			}
			return fmt.Sprintf("%d of at most %d", n, max)
		}
		cg := in.Cgroups
		if in.CgroupRoot != "" {
			cg += " (root " + in.CgroupRoot + ")"
		}
		if in.Cgroups == "off" {
			cg += " (resource limits are refused)"
		}
		pool := "off"
		if in.WarmShims.Target > 0 {
			pool = fmt.Sprintf("%d warm shims, %d idle", in.WarmShims.Target, in.WarmShims.Idle)
		}
		caps := strings.Join(in.Capabilities, ", ")
		f := newFields(e.io.out)
		f.add("daemon", in.Version+" at "+e.where)
		f.add("client", version.String())
		f.add("state", in.StateDir)
		f.add("sandboxes", bound(in.Capacity.Sandboxes, in.Capacity.MaxSandboxes))
		f.add("sessions", bound(in.Capacity.Sessions, in.Capacity.MaxSessions)+" running")
		f.add("capabilities", caps)
		f.add("cgroups", cg)
		if in.CgroupFavorDynMods != nil {
			fdm := "off (a session's cgroup move can wait a grace period after an idle spell)"
			if *in.CgroupFavorDynMods {
				fdm = "on"
			}
			f.add("favordynmods", fdm)
		}
		f.add("isolation", in.Isolation)
		if in.NetworkTable != "" {
			f.add("network table", "inet "+in.NetworkTable)
		}
		if in.NetworkPending > 0 {
			f.add("networks pending", fmt.Sprintf("%d (re-adopting since start)", in.NetworkPending))
		}
		f.add("warm pool", pool)
		f.add("memory available", units.BytesSize(float64(in.Capacity.MemoryAvailableBytes)))
		f.add("pids free", fmt.Sprint(in.Capacity.PIDsFree))
		if in.Capacity.Exhausted {
			f.add("exhausted", "yes: a new sandbox is refused")
		}
		return f.flush()
	})
}

func init() {
	commands = append(commands,
		&command{name: "caps", args: "", min: 0, max: 0,
			short: "list what this runnerd delivers on this host (capabilities)",
			setup: capsCmd},
	)
}

func capsCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return withClient(func(ctx context.Context, e *env, c *client.Client, _ []string) error {
		caps, err := c.Capabilities(ctx)
		if err != nil {
			return fail("capabilities", err)
		}
		if e.g.json {
			return e.printJSON(wire.Capabilities{Capabilities: nonNil(caps)})
		}
		for _, cp := range caps {
			fmt.Fprintln(e.io.out, cp)
		}
		return nil
	})
}
