// Package runner is the root of the runner module: a self-hosted daemon
// (runnerd) that runs AI-agent turns in named sandboxes, its per-session
// shim, and a Go client behind a provider-neutral contract.
//
// This package holds no code. Its test, deps_test.go, holds the dependency
// direction that docs/architecture.md draws, so that a wrong import fails the
// build instead of waiting for review. Start reading at README.md.
package runner
