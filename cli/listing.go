package cli

// Listings for scripts: -q and --format.

import (
	"flag"
	"fmt"
	"text/template"
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
