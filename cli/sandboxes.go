package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	units "github.com/docker/go-units"
	"golang.org/x/term"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/wire"
)

func init() {
	commands = append(commands,
		&command{name: "create", args: "NAME [--user USER] [--memory SIZE] [--cpus N] [--pids N] [--allow HOST]... [--deny-all]", min: 1, max: 1,
			short: "create a sandbox (idempotent: an existing NAME is returned as is)",
			long: `NAME is a DNS label: 1-63 characters of a-z, 0-9 and '-'. The sandbox gets a
workspace directory that commands run in and that outlives every session.
Limits bound all its sessions together, enforced by the kernel in its cgroup
(resource_limits in runner caps), as docker run takes them: --memory 512m
(b, k, m, g: powers of 1024), --cpus 1.5 (CPU time of 1.5 cores), --pids 256.
A network policy makes it contained from the start (network_policy in runner
caps): --allow HOST (repeatable: a name, *.suffix, an IPv4 address or CIDR)
allows only those, --deny-all allows nothing. A host that cannot enforce what
is asked refuses it (not_supported) and nothing is created; runner prints
runnerd's reason.
Examples:
  runner create web-1
  runner create agent-7 --memory 1g --cpus 2 --pids 512 --allow api.github.com --allow pypi.org`,
			setup: createCmd},
		&command{name: "ls", args: "", min: 0, max: 0,
			short: "list sandboxes",
			long: `--json prints an array of sandbox objects (docs/protocol.md, "Sandbox"); [] when
there are none. -q prints the names only, one a line; --format a Go template
per sandbox, over the fields of the sandbox object ({{.Name}}, {{.State}},
{{.Workspace}}, {{.CreatedAt}}, {{.Limits}}...), as docker ls --format.
Example:
  runner ls -q | xargs runner rm`,
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				lf := registerListFlags(fs, "sandbox names")
				return func(ctx context.Context, e *env, _, _ []string) error {
					tmpl, err := lf.template("ls")
					if err != nil {
						return err
					}
					c, err := e.client()
					if err != nil {
						return err
					}
					ctx, cancel := e.callCtx(ctx)
					defer cancel()
					all, err := c.ListAllSandboxes(ctx)
					if err != nil {
						return fail("list sandboxes", err)
					}
					if *lf.quiet || tmpl != nil {
						return printEach(e, all, tmpl, func(sb wire.Sandbox) string { return sb.Name })
					}
					if e.g.json {
						if all == nil {
							all = []wire.Sandbox{}
						}
						return e.printJSON(all)
					}
					if len(all) == 0 {
						fmt.Fprintln(e.io.out, "no sandboxes (runner create NAME makes one)")
						return nil
					}
					tw := tabwriter.NewWriter(e.io.out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tSTATE\tCREATED\tWORKSPACE")
					for _, sb := range all {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sb.Name, sb.State, when(sb.CreatedAt), sb.Workspace)
					}
					return tw.Flush()
				}
			}},
		&command{name: "get", args: "NAME", min: 1, max: 1,
			short: "show one sandbox",
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				return func(ctx context.Context, e *env, pos, _ []string) error {
					c, err := e.client()
					if err != nil {
						return err
					}
					ctx, cancel := e.callCtx(ctx)
					defer cancel()
					sb, err := c.GetSandbox(ctx, pos[0])
					if err != nil {
						return fail("get "+pos[0], err)
					}
					if e.g.json {
						return e.printJSON(sb)
					}
					printSandbox(e, sb)
					return nil
				}
			}},
		&command{name: "rm", args: "NAME...", min: 1, max: -1,
			short: "destroy sandboxes: stop their sessions, delete workspace and journals",
			long: `Running sessions get SIGTERM, then SIGKILL after 5 s (with or without -f, which
is accepted as docker rm -f spells it). A NAME that does not exist is reported
("no such sandbox") and runner exits 253 once the others are removed, as rm does;
with -f it is not an error (exit 0), as rm -f.
--json prints {"removed": [NAME...], "absent": [NAME...]}.`,
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				// rm always stops what runs (the sandbox's sessions are
				// its own); -f is docker rm -f's spelling of that.
				force := fs.Bool("f", false, "a NAME that does not exist is not an error (rm -f); running sessions are stopped with or without it")
				return func(ctx context.Context, e *env, pos, _ []string) error {
					c, err := e.client()
					if err != nil {
						return err
					}
					out := removedSandboxes{Removed: []string{}}
					var missing error
					for _, name := range pos {
						// DELETE answers 204 for a sandbox that is not
						// there; only a GET says a typo removed nothing.
						gctx, gcancel := e.callCtx(ctx)
						_, gerr := c.GetSandbox(gctx, name)
						gcancel()
						if errors.Is(gerr, adapter.ErrNotFound) {
							out.Absent = append(out.Absent, name)
							if !e.g.json {
								fmt.Fprintf(e.io.err, "runner: rm %s: no such sandbox\n", name)
							}
							if !*force && missing == nil {
								missing = &exitError{code: exitNotFound, kind: "not_found", what: "rm " + name, detail: "no such sandbox"}
							}
							continue
						}
						cctx, cancel := context.WithTimeout(ctx, e.g.timeout+30*time.Second)
						slow := e.slowNotice(time.Second, "runner: stopping the sessions of "+name+" (SIGTERM, SIGKILL after 5 s)...")
						err := c.DeleteSandbox(cctx, name)
						slow()
						cancel()
						if err != nil {
							if e.g.json && len(out.Removed) > 0 {
								_ = e.printJSON(out) // what was removed before the failure
							}
							return fail("rm "+name, err)
						}
						if !e.g.json {
							fmt.Fprintf(e.io.out, "removed %s\n", name)
						}
						out.Removed = append(out.Removed, name)
					}
					if e.g.json {
						if err := e.printJSON(out); err != nil {
							return err
						}
					}
					return missing
				}
			}},
		&command{name: "suspend", args: "NAME", min: 1, max: 1,
			short: "park a sandbox: stop its sessions (SIGTERM, SIGKILL after 10 s), keep its disk",
			setup: stateChange("suspend"),
		},
		&command{name: "resume", args: "NAME", min: 1, max: 1,
			short: "resume a suspended sandbox (same workspace, same incarnation)",
			setup: stateChange("resume"),
		},
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
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
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
						ce := &cliError{what: "policy " + pos[0], err: err}
						if _, kind := codeOf(err); kind == "not_supported" {
							ce.hint = "this runnerd cannot enforce egress policies on this host (network_policy is not in `runner caps`; it needs root and nftables), so it refuses rather than pretend"
						}
						return ce
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
			}},
		&command{name: "url", args: "NAME PORT [--wait DURATION]", min: 2, max: 2,
			short: "print a public preview URL that reaches PORT inside the sandbox",
			long: `The URL is a capability: whoever has it can open it, with no token. Asking again
for the same port returns the same URL; rm revokes it. Needs runnerd started
with --preview-listen and --preview-url (public_url in runner caps).

The server inside the sandbox may bind any of its addresses: 127.0.0.1, ::1,
0.0.0.0 or the sandbox's own. When nothing listens on PORT yet, the URL is
printed all the same, with a note on stderr: it starts working once something
listens. With --wait DURATION, runner waits (at most that long) until
something listens, then prints the URL; if nothing does in time it prints no
URL and exits 255 (unavailable).`,
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				wait := fs.Duration("wait", 0, "wait at most this long for something to listen on PORT before printing the URL (0: do not wait)")
				return func(ctx context.Context, e *env, pos, _ []string) error {
					port, err := strconv.Atoi(pos[1])
					if err != nil || port < 1 || port > 65535 {
						return usagef("url", "PORT %q: want a number in 1..65535", pos[1])
					}
					if *wait < 0 {
						return usagef("url", "--wait %s: want a duration of 0 or more", *wait)
					}
					c, err := e.client()
					if err != nil {
						return err
					}
					what := fmt.Sprintf("url %s %d", pos[0], port)
					u, err := previewURLWait(ctx, e, c, pos[0], port, *wait)
					if err != nil {
						ce := &cliError{what: what, err: err}
						switch _, kind := codeOf(err); {
						case kind == "not_supported":
							ce.hint = "this runnerd has no preview listener: start it with --preview-listen ADDR --preview-url 'http://{token}.localhost:PORT/'"
						case notYetListening(err):
							ce.hint = fmt.Sprintf("the URL starts working once something listens on port %d; run without --wait to print it now", port)
						}
						return ce
					}
					listening := u.Listening == nil || *u.Listening // an older runnerd answered only when something listened
					if e.g.json {
						return e.printJSON(wire.URL{URL: u.URL, Listening: &listening})
					}
					fmt.Fprintln(e.io.out, u.URL)
					if !listening {
						fmt.Fprintf(e.io.err, "runner: note: nothing listens on port %d in sandbox %s yet; the URL starts working once something does (wait for it with --wait DURATION)\n", port, pos[0])
					}
					return nil
				}
			}},
		&command{name: "caps", args: "", min: 0, max: 0,
			short: "list what this runnerd delivers on this host (capabilities)",
			setup: func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
				return func(ctx context.Context, e *env, _, _ []string) error {
					c, err := e.client()
					if err != nil {
						return err
					}
					ctx, cancel := e.callCtx(ctx)
					defer cancel()
					caps, err := c.Capabilities(ctx)
					if err != nil {
						return fail("capabilities", err)
					}
					if e.g.json {
						if caps == nil {
							caps = []string{}
						}
						return e.printJSON(wire.Capabilities{Capabilities: caps})
					}
					for _, cp := range caps {
						fmt.Fprintln(e.io.out, cp)
					}
					return nil
				}
			}},
	)
}

func createCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	user := fs.String("user", "", "run the sandbox's commands as this host user")
	memory := fs.String("memory", "", "memory limit: 512m, 2g (b, k, m, g; powers of 1024)")
	cpus := fs.Float64("cpus", 0, "CPU limit in cores: 1.5 is 150 ms of CPU time each 100 ms")
	pids := fs.Int64("pids", 0, "most tasks (processes and threads) alive at once")
	disk := fs.String("disk", "", "disk budget: 10g (b, k, m, g; powers of 1024); runnerd refuses it while it cannot enforce one")
	var allow stringList
	fs.Var(&allow, "allow", "allow egress to HOST only (repeatable): a name, *.suffix, an IPv4 address or CIDR")
	denyAll := fs.Bool("deny-all", false, "deny all egress (DNS and raw IPs too)")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		name := pos[0]
		req := wire.CreateSandbox{Name: name, User: *user}
		var lim wire.Limits
		if *memory != "" {
			n, err := units.RAMInBytes(*memory)
			if err != nil || n <= 0 {
				return usagef("create", "--memory %q: want a size such as 512m or 2g", *memory)
			}
			lim.MemoryBytes = n
		}
		if *cpus < 0 {
			return usagef("create", "--cpus %v: want a number of cores > 0", *cpus)
		}
		if *cpus > 0 {
			lim.CPUPeriodUS = 100000
			lim.CPUQuotaUS = int64(math.Round(*cpus * 100000))
		}
		if *pids < 0 {
			return usagef("create", "--pids %d: want a count > 0", *pids)
		}
		lim.Pids = *pids
		if *disk != "" {
			// Sent as disk_bytes, so runnerd (the one that knows whether it
			// can enforce a budget) answers: today it refuses any, and
			// nothing is created.
			n, err := units.RAMInBytes(*disk)
			if err != nil || n <= 0 {
				return usagef("create", "--disk %q: want a size such as 10g", *disk)
			}
			lim.DiskBytes = n
		}
		if lim != (wire.Limits{}) {
			req.Limits = &lim
		}
		switch {
		case *denyAll && len(allow) > 0:
			return usagef("create", "--deny-all and --allow exclude each other")
		case *denyAll:
			req.Network = &wire.Network{Allow: []string{}}
		case len(allow) > 0:
			req.Network = &wire.Network{Allow: allow}
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := e.callCtx(ctx)
		defer cancel()
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			ce := &cliError{what: "create " + name, err: err}
			if _, kind := codeOf(err); kind == "not_supported" {
				ce.hint = "nothing was created; `runner caps` lists what this runnerd enforces (resource_limits for limits, network_policy for --allow/--deny-all)"
			} else {
				ce.hint = createConflictHint(err, name)
			}
			return ce
		}
		if e.g.json {
			return e.printJSON(sb)
		}
		fmt.Fprintf(e.io.out, "%s %s (workspace %s)\n", sb.Name, sb.State, sb.Workspace)
		if sb.Limits != nil {
			fmt.Fprintf(e.io.out, "limits: %s\n", limitsText(*sb.Limits))
		}
		if sb.Network != nil {
			fmt.Fprintf(e.io.out, "network: %s\n", networkText(sb.Network))
		}
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

// removedSandboxes is what rm --json prints.
type removedSandboxes struct {
	Removed []string `json:"removed"`
	Absent  []string `json:"absent,omitempty"` // named but not there
}

func stateChange(verb string) func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return func(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
		return func(ctx context.Context, e *env, pos, _ []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(ctx, e.g.timeout+30*time.Second)
			defer cancel()
			if verb == "suspend" {
				defer e.slowNotice(time.Second, "runner: stopping the sessions of "+pos[0]+" (SIGTERM, SIGKILL after 10 s)...")()
			}
			var sb wire.Sandbox
			if verb == "suspend" {
				sb, err = c.Suspend(ctx, pos[0])
			} else {
				sb, err = c.Resume(ctx, pos[0])
			}
			if err != nil {
				return fail(verb+" "+pos[0], err)
			}
			if e.g.json {
				return e.printJSON(sb)
			}
			fmt.Fprintf(e.io.out, "%s %s\n", sb.Name, sb.State)
			return nil
		}
	}
}

func printSandbox(e *env, sb wire.Sandbox) {
	tw := tabwriter.NewWriter(e.io.out, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", sb.Name)
	fmt.Fprintf(tw, "state:\t%s\n", sb.State)
	fmt.Fprintf(tw, "incarnation:\t%s\n", sb.Incarnation)
	fmt.Fprintf(tw, "created:\t%s\n", when(sb.CreatedAt))
	if sb.ParkedAt != nil {
		fmt.Fprintf(tw, "parked:\t%s\n", when(*sb.ParkedAt))
	}
	fmt.Fprintf(tw, "workspace:\t%s\n", sb.Workspace)
	if sb.User != "" {
		fmt.Fprintf(tw, "user:\t%s\n", sb.User)
	}
	if sb.UID != nil {
		id := fmt.Sprintf("uid %d", *sb.UID)
		if sb.GID != nil {
			id += fmt.Sprintf(", gid %d", *sb.GID)
		}
		fmt.Fprintf(tw, "runs as:\t%s\n", id)
	}
	isolation := "none (runs as runnerd's user or --user, with its privileges)"
	if sb.Isolated {
		isolation = "isolated (an unprivileged uid of its own, no_new_privs, no capabilities)"
	}
	fmt.Fprintf(tw, "isolation:\t%s\n", isolation)
	fmt.Fprintf(tw, "network:\t%s\n", networkText(sb.Network))
	if sb.Limits != nil {
		fmt.Fprintf(tw, "limits:\t%s\n", limitsText(*sb.Limits))
	}
	if u := sb.Usage; u != nil {
		fmt.Fprintf(tw, "usage:\tmemory %s (peak %s), cpu %s, pids %d, oom kills %d\n",
			units.BytesSize(float64(u.MemoryBytes)), units.BytesSize(float64(u.MemoryPeakBytes)),
			(time.Duration(u.CPUUsec) * time.Microsecond).Round(time.Millisecond), u.Pids, u.OOMKills)
	}
	tw.Flush()
}

// when formats a time for people: local time to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

// slowNotice prints msg to a terminal stderr if the returned stop function
// is not called within d: a person then knows why runner waits.
func (e *env) slowNotice(d time.Duration, msg string) (stop func()) {
	if !term.IsTerminal(int(e.io.err.Fd())) {
		return func() {}
	}
	t := time.AfterFunc(d, func() { fmt.Fprintln(e.io.err, msg) })
	return func() { t.Stop() }
}
