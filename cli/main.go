// Package cli is runner, the command-line client of runnerd: create and
// list sandboxes, run commands in them, attach a terminal to a running
// session, replay its output, and steer it (stdin, signals, terminate).
//
// It is wiring only: flags and arguments become calls of the client
// package, and answers become output and an exit code. `runner --help`
// documents every command and the exit-code table; docs/cli.md has a tour.
// cmd/runner is one call of Main.
package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Main runs runner with args (without the program name) and returns the
// process's exit code. stdin, stdout and stderr are files because attach
// and exec -it put a terminal in raw mode and follow its size.
func Main(ctx context.Context, args []string, stdin, stdout, stderr *os.File) int {
	// A write to a closed stdout or stderr pipe (runner ... | head) is
	// then EPIPE, not death by SIGPIPE: exec ends the command it
	// started before runner exits 141 (follow.go). Notify rather than
	// Ignore: an ignored SIGPIPE is inherited by any process started.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	return run(ctx, args, stdio{in: stdin, out: stdout, err: stderr})
}
