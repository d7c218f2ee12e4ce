package cli

// Sandboxes: create, ls, get, rm, suspend and resume.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	units "github.com/docker/go-units"
	"golang.org/x/term"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/client"
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
			setup: lsCmd},
		&command{name: "get", args: "NAME", min: 1, max: 1,
			short: "show one sandbox",
			setup: getCmd},
		&command{name: "rm", args: "NAME...", min: 1, max: -1,
			short: "destroy sandboxes: stop their sessions, delete workspace and journals",
			long: `Running sessions get SIGTERM, then SIGKILL after 5 s (with or without -f, which
is accepted as docker rm -f spells it). A NAME that does not exist is reported
("no such sandbox") and runner exits 253 once the others are removed, as rm does;
with -f it is not an error (exit 0), as rm -f.
--json prints {"removed": [NAME...], "absent": [NAME...]}.`,
			setup: rmCmd},
		&command{name: "suspend", args: "NAME", min: 1, max: 1,
			short: "park a sandbox: stop its sessions (SIGTERM, SIGKILL after 10 s), keep its disk",
			setup: stateChange("suspend"),
		},
		&command{name: "resume", args: "NAME", min: 1, max: 1,
			short: "resume a suspended sandbox (same workspace, same incarnation)",
			setup: stateChange("resume"),
		},
	)
}

// createFlags registers the flags of a new sandbox's options (user,
// limits, disk, egress) on fs, for create and fork; the function it
// returns builds the request for name from them.
func createFlags(fs *flag.FlagSet, verb string) func(name string) (wire.CreateSandbox, error) {
	user := fs.String("user", "", "run the sandbox's commands as this host user")
	lf := registerLimitFlags(fs)
	disk := fs.String("disk", "", "disk budget: 10g (b, k, m, g; powers of 1024); runnerd refuses it while it cannot enforce one")
	var allow stringList
	fs.Var(&allow, "allow", "allow egress to HOST only (repeatable): a name, *.suffix, an IPv4 address or CIDR")
	denyAll := fs.Bool("deny-all", false, "deny all egress (DNS and raw IPs too)")
	return func(name string) (wire.CreateSandbox, error) {
		req := wire.CreateSandbox{Name: name, User: *user}
		var lim wire.Limits
		if err := lf.apply(verb, lf.given(), &lim); err != nil {
			return req, err
		}
		if *disk != "" {
			// Sent as disk_bytes, so runnerd (the one that knows whether it
			// can enforce a budget) answers: today it refuses any, and
			// nothing is created.
			n, err := units.RAMInBytes(*disk)
			if err != nil || n <= 0 {
				return req, usagef(verb, "--disk %q: want a size such as 10g", *disk)
			}
			lim.DiskBytes = n
		}
		if lim != (wire.Limits{}) {
			req.Limits = &lim
		}
		switch {
		case *denyAll && len(allow) > 0:
			return req, usagef(verb, "--deny-all and --allow exclude each other")
		case *denyAll:
			req.Network = &wire.Network{Allow: []string{}}
		case len(allow) > 0:
			req.Network = &wire.Network{Allow: allow}
		}
		return req, nil
	}
}

func createCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	request := createFlags(fs, "create")
	return func(ctx context.Context, e *env, pos, _ []string) error {
		name := pos[0]
		req, err := request(name)
		if err != nil {
			return err
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
	f := newFields(e.io.out)
	f.add("name", sb.Name)
	f.add("state", sb.State)
	f.add("incarnation", sb.Incarnation)
	f.add("created", when(sb.CreatedAt))
	if sb.ParkedAt != nil {
		f.add("parked", when(*sb.ParkedAt))
	}
	f.add("workspace", sb.Workspace)
	if sb.User != "" {
		f.add("user", sb.User)
	}
	if sb.UID != nil {
		id := fmt.Sprintf("uid %d", *sb.UID)
		if sb.GID != nil {
			id += fmt.Sprintf(", gid %d", *sb.GID)
		}
		f.add("runs as", id)
	}
	isolation := "none (runs as runnerd's user or --user, with its privileges)"
	if sb.Isolated {
		isolation = "isolated (an unprivileged uid of its own, no_new_privs, no capabilities)"
	}
	f.add("isolation", isolation)
	f.add("network", networkText(sb.Network))
	if sb.Limits != nil {
		f.add("limits", limitsText(*sb.Limits))
	}
	if u := sb.Usage; u != nil {
		f.add("usage", fmt.Sprintf("memory %s (peak %s), cpu %s, pids %d, oom kills %d",
			units.BytesSize(float64(u.MemoryBytes)), units.BytesSize(float64(u.MemoryPeakBytes)),
			(time.Duration(u.CPUUsec)*time.Microsecond).Round(time.Millisecond), u.Pids, u.OOMKills))
	}
	f.flush()
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

func lsCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	lf := registerListFlags(fs, "sandbox names")
	return listCmd("ls", lf, func(ctx context.Context, e *env, c *client.Client, _ []string, form listForm) error {
		all, err := c.ListAllSandboxes(ctx)
		if err != nil {
			return fail("list sandboxes", err)
		}
		return printList(e, form, listing[wire.Sandbox]{
			items:  all,
			key:    func(sb wire.Sandbox) string { return sb.Name },
			empty:  "no sandboxes (runner create NAME makes one)",
			header: "NAME\tSTATE\tCREATED\tWORKSPACE",
			row: func(sb wire.Sandbox) []string {
				return []string{sb.Name, sb.State, when(sb.CreatedAt), sb.Workspace}
			},
		})
	})
}

func getCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	return withClient(func(ctx context.Context, e *env, c *client.Client, pos []string) error {
		sb, err := c.GetSandbox(ctx, pos[0])
		if err != nil {
			return fail("get "+pos[0], err)
		}
		if e.g.json {
			return e.printJSON(sb)
		}
		printSandbox(e, sb)
		return nil
	})
}

func rmCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
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
}
