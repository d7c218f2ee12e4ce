package cli

// --env and --env-file of exec, run and spawn. A value on runner's
// command line is in its argv, which every process that can list the
// host's processes reads (ps, /proc/PID/cmdline), sandboxes included:
// they share the host's process list. --env KEY (the value from runner's
// own environment, as docker run -e KEY takes it) and --env-file FILE
// keep a secret out of argv; runner sends the value in the request body
// only.

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
)

// envHelp is the flags' help, which says which forms keep a value out
// of argv.
const envHelp = "KEY=VALUE: set KEY in the command's environment; KEY alone: take its value from runner's own environment (repeatable). " +
	"A VALUE on the command line is visible to every process that runs ps (sandboxes too): pass secrets as --env KEY or --env-file"

// envFlags are --env and --env-file.
type envFlags struct {
	envs  stringList
	files stringList
}

func registerEnvFlags(fs *flag.FlagSet, f *envFlags) {
	fs.Var(&f.envs, "env", envHelp)
	fs.Var(&f.files, "env-file", "read KEY=VALUE lines from FILE (repeatable; # comments and blank lines skipped, KEY alone as --env KEY); --env wins over a file")
}

// resolve is the command's environment: each --env-file's lines in
// order, then each --env. A KEY without a value takes runner's own, and
// one runner does not have is a usage error (a typo never becomes an
// empty or missing variable silently). Errors never quote a value.
func (f *envFlags) resolve(cmd string) ([]string, error) {
	var out []string
	add := func(entry, where string) error {
		key, _, hasValue := strings.Cut(entry, "=")
		if key == "" || strings.ContainsAny(key, " \t\x00") {
			return usagef(cmd, "%s: want KEY=VALUE or KEY, got an entry whose name is %q", where, key)
		}
		if hasValue {
			out = append(out, entry)
			return nil
		}
		v, ok := os.LookupEnv(key)
		if !ok {
			return usagef(cmd, "%s: %s is not set in runner's environment (--env KEY takes the value from there)", where, key)
		}
		out = append(out, key+"="+v)
		return nil
	}
	for _, file := range f.files {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usagef(cmd, "--env-file: %v", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 0, 64<<10), len(b)+1)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSuffix(sc.Text(), "\r")
			trimmed := strings.TrimLeft(line, " \t")
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			if err := add(trimmed, fmt.Sprintf("--env-file %s line %d", file, n)); err != nil {
				return nil, err
			}
		}
		if err := sc.Err(); err != nil {
			return nil, usagef(cmd, "--env-file %s: %v", file, err)
		}
	}
	for _, entry := range f.envs {
		if err := add(entry, "--env"); err != nil {
			return nil, err
		}
	}
	return out, nil
}
