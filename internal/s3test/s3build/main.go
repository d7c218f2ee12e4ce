// Command s3build fills the cache of internal/s3test (the SeaweedFS weed
// binary of the move tests' real S3 server) before the test run, so CI
// pays the cold build outside `go test`'s timeout. It prints the binary's
// path and how long the build took; a warm cache returns at once.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agentrunner/runner/internal/s3test"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	bin, err := s3test.Build(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "s3build:", err)
		os.Exit(1)
	}
	fmt.Printf("s3build: %s ready in %s\n", bin, time.Since(start).Round(time.Second))
}
