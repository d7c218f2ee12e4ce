// Command runner is the command-line client of runnerd: create and list
// sandboxes, run commands in them, attach a terminal to a running session,
// replay its output, and steer it (stdin, signals, terminate).
//
// It is wiring only: flags and arguments become calls of the client
// package, and answers become output and an exit code. `runner --help`
// documents every command and the exit-code table; docs/cli.md has a tour.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// A write to a closed stdout or stderr pipe (runner ... | head) is
	// then EPIPE, not death by SIGPIPE: exec ends the command it
	// started before runner exits 141 (follow.go). Notify rather than
	// Ignore: an ignored SIGPIPE is inherited by any process started.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	os.Exit(run(context.Background(), os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr}))
}
