// Command kubebuild fills the cache of apiservertest (the kube-apiserver
// and etcd binaries of client/fleet/k8s's real-API-server tests) before
// the test run, so CI pays the cold build outside `go test`'s timeout and
// the tests start their server in seconds. It prints the cache directory
// and how long the build took; a warm cache returns at once.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agentrunner/runner/client/fleet/k8s/apiservertest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	bins, err := apiservertest.Build(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubebuild:", err)
		os.Exit(1)
	}
	fmt.Printf("kubebuild: %s and %s ready in %s\n", bins.APIServer, bins.Etcd, time.Since(start).Round(time.Second))
}
