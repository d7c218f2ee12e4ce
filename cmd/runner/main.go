// Command runner is the command-line client of runnerd: create and list
// sandboxes, run commands in them, attach a terminal to a running session,
// replay its output, and steer it (stdin, signals, terminate).
//
// It is one call of package cli, where the commands live; `runner --help`
// documents every command and the exit-code table; docs/cli.md has a tour.
package main

import (
	"context"
	"os"

	"github.com/agentrunner/runner/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
