// Package bench is runner's end-to-end benchmark harness. [Run] builds the
// real runnerd into a temporary directory, starts it on a temporary state
// directory with a loopback TCP listener, and measures it through the real
// client (package client) next to a physical baseline measured in the same
// run: stream throughput against head|tee, attach replay against cat, exec
// and spawn against fork/exec of /bin/true from Go, seek against the same
// seek in a small journal, follow latency against a pipe between two
// processes, fan-out against one client, the private memory of idle
// sessions, and a busy host (group "scale", scale.go): listing 1,000
// running sessions of one sandbox and 10,000 sandboxes against a raw bbolt
// scan of the same registry records, spawn with 1,000 live sessions
// against an idle daemon, and destroying a sandbox of 1,000 sessions. docs/benchmarks.md ("End to end") holds the figures and the
// command that reproduces them:
//
//	go run ./bench/cmd/runnerbench
//
// Every figure is measured Repeat times; the report quotes the median and
// the min–max spread of the value, of its baseline and of their ratio
// (computed per round, so a noisy neighbour moves both sides). Nothing in
// this package asserts a speed: TestHarnessTiny runs the whole harness at
// a tiny size so it cannot rot, and checks only that every figure was
// produced.
//
// The harness starts processes and writes GiB-sized files; everything it
// starts it stops, and everything it writes lives under one temporary
// directory that Run removes.
package bench
