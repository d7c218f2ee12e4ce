package cli

// Command-line parsing beyond the flag package: flags among the arguments,
// -it as -i -t, and the nearest name to a mistyped command or flag.

import (
	"flag"
	"strings"
)

// nearFlag is the flag of fs nearest to the first flag in args that fs
// does not define ("--detach-ky" gives "--detach-key"), "" when there is
// no such flag or none is close. It reads the command line, not the
// flag package's error text.
func nearFlag(fs *flag.FlagSet, args []string) string {
	var all []string
	fs.VisitAll(func(f *flag.Flag) { all = append(all, f.Name) })
	for _, a := range args {
		if a == "--" {
			return ""
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "" || fs.Lookup(name) != nil {
			continue
		}
		if len(name) > 1 && a[1] != '-' && allBoolLetters(fs, name) {
			continue // -it: combined one-letter flags
		}
		// A one- or two-letter slip ("-iz") has too many neighbours
		// for a suggestion to help.
		if near := nearest(name, all); len(name) > 2 && len(near) > 1 {
			return dash(near)
		}
		return ""
	}
	return ""
}

// allBoolLetters reports whether each letter of s is a boolean flag of
// fs (so "-it" is -i -t, not a flag named "it").
func allBoolLetters(fs *flag.FlagSet, s string) bool {
	for _, r := range s {
		f := fs.Lookup(string(r))
		if f == nil {
			return false
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			return false
		}
	}
	return true
}

// nearest is the command name closest to a mistyped one: within two
// edits (a transposition is one), or the only command it is a prefix of;
// "" when none is close enough to be worth suggesting.
func nearest(typed string, all []string) string {
	best, bestD := "", 3
	var prefixed []string
	for _, n := range all {
		if strings.HasPrefix(n, typed) {
			prefixed = append(prefixed, n)
		}
		if d := editDistance(typed, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" && len(prefixed) == 1 {
		return prefixed[0]
	}
	return best
}

// editDistance is the optimal-string-alignment distance: insertions,
// deletions, substitutions and transpositions of neighbours each cost 1.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// parseInterspersed parses flags anywhere among the positional arguments.
// With argvAfter > 0, once that many positional arguments are seen the rest
// of the line (after an optional "--") is returned as argv, unparsed, so
// `runner exec box ls -la` runs `ls -la`.
func parseInterspersed(fs *flag.FlagSet, args []string, argvAfter int) (pos, argv []string, err error) {
	for {
		args = expandShort(fs, args)
		if argvAfter > 0 && len(pos) == argvAfter {
			// Flags may still come before the command; the first
			// non-flag (or what follows "--") starts it.
			if err := fs.Parse(args); err != nil {
				return nil, nil, err
			}
			return pos, fs.Args(), nil
		}
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil, nil
		}
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			// An explicit end of flags: everything after is positional,
			// or the command line for exec/spawn.
			for len(rest) > 0 && (argvAfter == 0 || len(pos) < argvAfter) {
				pos, rest = append(pos, rest[0]), rest[1:]
			}
			return pos, rest, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// expandShort splits combined one-letter boolean flags ("-it" into "-i",
// "-t", as docker and POSIX getopt take them) among the flags the parser
// reads next: the run of flag arguments at the start of args, up to the
// first non-flag or "--". What follows (a command's own "-la") is left
// as it is. A token that names a flag itself is never split.
func expandShort(fs *flag.FlagSet, args []string) []string {
	isBool := func(name string) bool {
		f := fs.Lookup(name)
		if f == nil {
			return false
		}
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		return ok && b.IsBoolFlag()
	}
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		name, _, hasValue := strings.Cut(name, "=")
		if fs.Lookup(name) != nil {
			out = append(out, a)
			if !hasValue && !isBool(name) && i+1 < len(args) {
				i++ // the flag's value
				out = append(out, args[i])
			}
			continue
		}
		combined := a[1] != '-' && !hasValue && len(name) > 1
		for _, r := range name {
			if !isBool(string(r)) {
				combined = false
				break
			}
		}
		if !combined {
			return append(out, args[i:]...) // the parser reports it
		}
		for _, r := range name {
			out = append(out, "-"+string(r))
		}
	}
	return out
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
