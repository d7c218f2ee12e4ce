package cli

// Listings for scripts (-q, --format) and runner ps, the sessions of
// every sandbox.

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"text/template"

	"github.com/agentrunner/runner/wire"
)

// listFlags are -q and --format of a listing.
type listFlags struct {
	quiet  *bool
	format *string
}

func registerListFlags(fs *flag.FlagSet, what string) listFlags {
	return listFlags{
		quiet:  fs.Bool("q", false, "print the "+what+" only, one a line"),
		format: fs.String("format", "", "print each entry with a Go template over its JSON object's fields ({{.Name}}, {{.State}}, ...)"),
	}
}

// template parses --format (nil without it); -q and --format exclude
// each other.
func (l listFlags) template(cmd string) (*template.Template, error) {
	if *l.format == "" {
		return nil, nil
	}
	if *l.quiet {
		return nil, usagef(cmd, "-q and --format exclude each other")
	}
	t, err := template.New("format").Option("missingkey=error").Parse(*l.format)
	if err != nil {
		return nil, usagef(cmd, "--format: %v", err)
	}
	return t, nil
}

// printEach prints each item on a line of its own: with the template t,
// else its key (-q).
func printEach[T any](e *env, items []T, t *template.Template, key func(T) string) error {
	for _, it := range items {
		if t == nil {
			if _, err := fmt.Fprintln(e.io.out, key(it)); err != nil {
				return err
			}
			continue
		}
		if err := t.Execute(e.io.out, it); err != nil {
			return &exitError{code: exitUsage, kind: "usage", msg: fmt.Sprintf("runner: --format: %v", err)}
		}
		if _, err := fmt.Fprintln(e.io.out); err != nil {
			return err
		}
	}
	return nil
}

// psRow is one line of runner ps: a session and its sandbox.
type psRow struct {
	Sandbox string       `json:"sandbox"`
	Session wire.Session `json:"session"`
}

func init() {
	commands = append(commands, &command{name: "ps", args: "[-a]", min: 0, max: 0,
		short: "list running sessions across every sandbox (-a: ended ones too)",
		long: `One line per session: its sandbox, id, state, exit, output so far, start and
command, by sandbox name and start time. -q prints "SANDBOX ID" pairs; --format a
Go template over {{.Sandbox}} and {{.Session}} (a session object:
{{.Session.ID}}, {{.Session.State}}...); --json an array of {"sandbox",
"session"} objects.
Example:
  runner ps -q | while read sb id; do runner terminate "$sb" "$id"; done`,
		setup: psCmd})
}

func psCmd(fs *flag.FlagSet) func(context.Context, *env, []string, []string) error {
	all := fs.Bool("a", false, "list ended sessions too")
	lf := registerListFlags(fs, `"SANDBOX ID" pairs`)
	return func(ctx context.Context, e *env, _, _ []string) error {
		tmpl, err := lf.template("ps")
		if err != nil {
			return err
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		ctx, cancel := e.callCtx(ctx)
		defer cancel()
		sbs, err := c.ListAllSandboxes(ctx)
		if err != nil {
			return fail("list sandboxes", err)
		}
		rows := []psRow{}
		for _, sb := range sbs {
			list, err := c.Sessions(ctx, sb.Name)
			if err != nil {
				// A listing with a sandbox left out would be a short
				// set passed off as whole: fail instead.
				return fail("sessions "+sb.Name, err)
			}
			sortByStart(list)
			for _, s := range list {
				if *all || s.State == wire.SessionRunning {
					rows = append(rows, psRow{Sandbox: sb.Name, Session: s})
				}
			}
		}
		switch {
		case *lf.quiet || tmpl != nil:
			return printEach(e, rows, tmpl, func(r psRow) string { return r.Sandbox + " " + r.Session.ID })
		case e.g.json:
			return e.printJSON(rows)
		case len(rows) == 0 && *all:
			fmt.Fprintln(e.io.out, "no sessions")
			return nil
		case len(rows) == 0:
			fmt.Fprintln(e.io.out, "no running sessions (runner ps -a lists ended ones too)")
			return nil
		}
		tw := tabwriter.NewWriter(e.io.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SANDBOX\tID\tSTATE\tEXIT\tTTY\tOUTPUT\tSTARTED\tCOMMAND")
		for _, r := range rows {
			s := r.Session
			tty := "-"
			if s.TTY {
				tty = "tty"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Sandbox, s.ID, s.State, exitColumn(s), tty, outputColumn(s), when(s.StartedAt), argvString(s.Argv))
		}
		return tw.Flush()
	}
}
