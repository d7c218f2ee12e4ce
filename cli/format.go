package cli

// What every command prints the same way, in one place: --json (indented,
// [] for an empty list), a listing's four forms (-q, --format, --json, a
// table), its table's columns, a "key: value" block for one object, and
// times for people.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/agentrunner/runner/client"
)

// printJSON prints v as indented JSON and a newline: a command's whole
// --json answer.
func (e *env) printJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = e.io.out.Write(b)
	return err
}

// nonNil is s, or an empty slice when s is nil, so that --json prints []
// (or "" for bytes), never null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

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

// listForm is how a listing prints, from -q and --format: with quiet its
// keys, with tmpl the template per item; with neither, --json or the
// table. The zero listForm is a listing without -q and --format.
type listForm struct {
	quiet bool
	tmpl  *template.Template
}

// form parses --format; -q and --format exclude each other. It runs before
// any call of runnerd, so a mistyped template costs nothing.
func (l listFlags) form(cmd string) (listForm, error) {
	if *l.format == "" {
		return listForm{quiet: *l.quiet}, nil
	}
	if *l.quiet {
		return listForm{}, usagef(cmd, "-q and --format exclude each other")
	}
	t, err := template.New("format").Option("missingkey=error").Parse(*l.format)
	if err != nil {
		return listForm{}, usagef(cmd, "--format: %v", err)
	}
	return listForm{tmpl: t}, nil
}

// listCmd is the body of a listing command: -q and --format are read
// first (a mistake there is a usage error before runnerd is called), then
// body runs as withClient's, with the form.
func listCmd(cmd string, lf listFlags, body func(ctx context.Context, e *env, c *client.Client, pos []string, f listForm) error) func(context.Context, *env, []string, []string) error {
	return func(ctx context.Context, e *env, pos, argv []string) error {
		form, err := lf.form(cmd)
		if err != nil {
			return err
		}
		return withClient(func(ctx context.Context, e *env, c *client.Client, pos []string) error {
			return body(ctx, e, c, pos, form)
		})(ctx, e, pos, argv)
	}
}

// listing is what a listing command prints: its items, and how each form
// shows them.
type listing[T any] struct {
	items []T
	key   func(T) string // -q: an item's line
	// json is what --json prints when it is not the items themselves
	// (a wrapping object); nil prints the items, [] for none.
	json any
	// empty is the text printed when there are no items; "" prints the
	// table's header alone.
	empty  string
	header string           // the table's column names, tab-separated
	row    func(T) []string // an item's cells, in the header's order
}

// printList prints l in the form asked for: -q, --format, --json, else a
// table (or l.empty when there are no items).
func printList[T any](e *env, f listForm, l listing[T]) error {
	switch {
	case f.quiet || f.tmpl != nil:
		return printEach(e, l.items, f.tmpl, l.key)
	case e.g.json && l.json != nil:
		return e.printJSON(l.json)
	case e.g.json:
		return e.printJSON(nonNil(l.items))
	case len(l.items) == 0 && l.empty != "":
		fmt.Fprintln(e.io.out, l.empty)
		return nil
	}
	return printTable(e.io.out, l.header, l.items, l.row)
}

// printTable prints a table for people: the header (none when ""), then a
// row per item, columns two spaces apart.
func printTable[T any](w io.Writer, header string, items []T, row func(T) []string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header != "" {
		fmt.Fprintln(tw, header)
	}
	for _, it := range items {
		fmt.Fprintln(tw, strings.Join(row(it), "\t"))
	}
	return tw.Flush()
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

// fields is one object for people (get, info): a "key: value" line each,
// the values aligned one space after the longest key.
type fields struct{ tw *tabwriter.Writer }

func newFields(w io.Writer) fields {
	return fields{tw: tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)}
}

// add prints one line: key, a colon, and value.
func (f fields) add(key, value string) { fmt.Fprintf(f.tw, "%s:\t%s\n", key, value) }

// flush prints the aligned lines.
func (f fields) flush() error { return f.tw.Flush() }

// when formats a time for people: local time to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}
