// Package standin holds the process plumbing the provider stand-ins
// (adapter/e2b/e2btest, adapter/daytona/daytonatest,
// adapter/sprites/spritestest) share: opening a pseudo-terminal with the
// standard library alone, and killing every process of one sandbox, found
// by an environment variable the stand-in sets on what it starts.
//
// Invariants: the package imports only the standard library (the stand-ins
// may not pull a PTY library into a control plane's test build), and
// [KillTagged] signals only processes whose environment carries the exact
// NAME=id entry, by pid, never itself.
package standin
