package cli

// runner limits: show or change a sandbox's limits, the runner command
// a create conflict points to (never PUT /v1/...).

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"

	units "github.com/docker/go-units"

	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands, &command{name: "limits", args: "NAME [--memory SIZE] [--cpus N] [--pids N] [--none]", min: 1, max: 1,
		short: "show or change a sandbox's limits (memory, CPU, pids)",
		long: `With no flags, prints the sandbox's limits (runner get adds its usage). With flags, changes those
limits and keeps the others (the flags are create's: --memory 512m, --cpus 1.5,
--pids 256); --none removes every limit the host does not impose. A running
sandbox's cgroup gets them at once, its running sessions included (needs
resource_limits in runner caps); a limit the kernel refuses (memory below what
the sandbox holds) leaves the old ones in place, and runner prints runnerd's
reason.
Examples:
  runner limits web-1
  runner limits web-1 --memory 2g --pids 1024`,
		setup: limitsCmd})
}

func limitsCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	lf := registerLimitFlags(fs)
	none := fs.Bool("none", false, "remove every limit (the host's defaults stay)")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		name, what := pos[0], "limits "+pos[0]
		set := flagsSet(fs)
		if *none && (set["memory"] || set["cpus"] || set["pids"]) {
			return usagef("limits", "--none and --memory/--cpus/--pids exclude each other")
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := e.callCtx(ctx)
		defer cancel()
		sb, err := c.GetSandbox(ctx, name)
		if err != nil {
			return fail(what, err)
		}
		if *none || set["memory"] || set["cpus"] || set["pids"] {
			var l wire.Limits
			if sb.Limits != nil && !*none {
				l = *sb.Limits
			}
			if err := lf.apply("limits", set, &l); err != nil {
				return err
			}
			if sb, err = c.SetLimits(ctx, name, l); err != nil {
				return failHint(what, err, kindOf(err) == "not_supported",
					"this runnerd does not enforce limits here (resource_limits is not in `runner caps`)")
			}
		}
		if e.g.json {
			return e.printJSON(sb)
		}
		l := "none"
		if sb.Limits != nil {
			l = limitsText(*sb.Limits)
		}
		fmt.Fprintf(e.io.out, "%s: %s\n", sb.Name, l)
		return nil
	}
}

// limitsText says a sandbox's limits as create takes them.
func limitsText(l wire.Limits) string {
	var parts []string
	if l.MemoryBytes > 0 {
		parts = append(parts, "memory "+units.BytesSize(float64(l.MemoryBytes)))
	}
	if l.CPUQuotaUS > 0 {
		period := l.CPUPeriodUS
		if period == 0 {
			period = 100000
		}
		parts = append(parts, "cpus "+strconv.FormatFloat(float64(l.CPUQuotaUS)/float64(period), 'f', -1, 64))
	}
	if l.CPUWeight > 0 && l.CPUWeight != 100 {
		parts = append(parts, fmt.Sprintf("cpu weight %d", l.CPUWeight))
	}
	if l.Pids > 0 {
		parts = append(parts, fmt.Sprintf("pids %d", l.Pids))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// limitFlags are --memory, --cpus and --pids, as create and limits take
// them (docker run's spellings).
type limitFlags struct {
	memory *string
	cpus   *float64
	pids   *int64
}

func registerLimitFlags(fs *flag.FlagSet) limitFlags {
	return limitFlags{
		memory: fs.String("memory", "", "memory limit: 512m, 2g (b, k, m, g; powers of 1024)"),
		cpus:   fs.Float64("cpus", 0, "CPU limit in cores: 1.5 is 150 ms of CPU time each 100 ms"),
		pids:   fs.Int64("pids", 0, "most tasks (processes and threads) alive at once"),
	}
}

// given names the flags that have a value, as create reads them: "" and
// 0 ask for no limit.
func (f limitFlags) given() map[string]bool {
	return map[string]bool{"memory": *f.memory != "", "cpus": *f.cpus != 0, "pids": *f.pids != 0}
}

// apply sets in l the limits of the flags set names; a value that is no
// limit (a size of 0, a negative count) is a usage error of cmd, and l is
// then not sent.
func (f limitFlags) apply(cmd string, set map[string]bool, l *wire.Limits) error {
	if set["memory"] {
		n, err := units.RAMInBytes(*f.memory)
		if err != nil || n <= 0 {
			return usagef(cmd, "--memory %q: want a size such as 512m or 2g", *f.memory)
		}
		l.MemoryBytes = n
	}
	if set["cpus"] {
		if *f.cpus <= 0 {
			return usagef(cmd, "--cpus %v: want a number of cores > 0", *f.cpus)
		}
		l.CPUPeriodUS = 100000
		l.CPUQuotaUS = int64(math.Round(*f.cpus * 100000))
	}
	if set["pids"] {
		if *f.pids <= 0 {
			return usagef(cmd, "--pids %d: want a count > 0", *f.pids)
		}
		l.Pids = *f.pids
	}
	return nil
}
