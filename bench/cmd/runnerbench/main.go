// Command runnerbench runs runner's end-to-end benchmark harness (package
// bench) and prints the report as the Markdown table docs/benchmarks.md
// quotes. With no flags it runs the full configuration (1 GiB streams, a
// 4 GiB seek journal, 500 calls, 100 and 1,000 idle sessions, a busy host
// of 1,000 sessions and 10,000 sandboxes, 3 rounds):
//
//	go run ./bench/cmd/runnerbench
//	go run ./bench/cmd/runnerbench -profile /tmp/prof   # also CPU profiles of the throughput run
//	go run ./bench/cmd/runnerbench -tiny                # every figure at a tiny size, seconds
//	go run ./bench/cmd/runnerbench -only scale          # the busy-host figures alone
//	go run ./bench/cmd/runnerbench -only calls -cgroups off   # spawn/exec without per-sandbox cgroups
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/bench"
)

func main() {
	cfg := bench.Full()
	tiny := flag.Bool("tiny", false, "run every figure at a tiny size (what CI runs)")
	only := flag.String("only", "", "comma-separated groups to run: stream, calls, seek, follow, idle, limits, scale (default all)")
	repeat := flag.Int("repeat", 0, "rounds of every figure (default 3)")
	profile := flag.String("profile", "", "directory for CPU profiles of an extra, in-process throughput run")
	calls := flag.Int("calls", 0, "exec and spawn calls per round, back to back (default 500)")
	paced := flag.Int("paced", -1, "exec and spawn calls per round, one per 25 ms (default 100; 0: none)")
	sessions := flag.Int("sessions", 0, "running sessions in one sandbox for the scale figures (default 1000)")
	sandboxes := flag.Int("sandboxes", 0, "sandboxes listed by the scale figures (default 10000)")
	cgroups := flag.String("cgroups", "", `runnerd's --cgroups: "auto" (its default: as root, every command in its sandbox's cgroups) or "off"`)
	isolate := flag.String("isolate", "", `runnerd's --isolate: "none" (default here: uncontained sandboxes) or "all" (a root runnerd's default)`)
	idlePace := flag.Duration("idle-pace", -1, "one idle session spawned per this long (default 60ms; 0: as fast as they go)")
	tmp := flag.String("tmp", "", "directory for the run's files (journals, baseline files; default $TMPDIR)")
	flag.Parse()
	if *tiny {
		cfg = bench.Tiny()
	}
	if *repeat > 0 {
		cfg.Repeat = *repeat
	}
	if *calls > 0 {
		cfg.Calls = *calls
	}
	if *paced >= 0 {
		cfg.PacedCalls = *paced
	}
	if *idlePace >= 0 {
		cfg.IdlePace = *idlePace
	}
	if *sessions > 0 {
		cfg.ScaleSessions = *sessions
	}
	if *sandboxes > 0 {
		cfg.ScaleSandboxes = *sandboxes
	}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	cfg.ProfileDir, cfg.TempDir, cfg.Log, cfg.Cgroups, cfg.Isolate = *profile, *tmp, os.Stderr, *cgroups, *isolate
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, cfg)
	if rep != nil && len(rep.Figures) > 0 {
		rep.Markdown(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "runnerbench:", err)
		os.Exit(1)
	}
}
