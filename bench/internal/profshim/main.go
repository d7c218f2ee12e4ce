// Command profshim is runner's shim (shim.Main) with a CPU profile: when
// $RUNNERBENCH_SHIM_PROFILE names a directory, the shim writes
// shim-PID.pprof there when it exits. The harness's profile run uses it as
// the daemon's shim command; nothing else should.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"

	"github.com/agentrunner/runner/shim"
)

func main() {
	dir := os.Getenv("RUNNERBENCH_SHIM_PROFILE")
	args := os.Args[1:]
	if dir == "" || slices.Contains(args, "--detach") {
		os.Exit(shim.Main(args, shim.Hooks{}))
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("shim-%d.pprof", os.Getpid())))
	if err == nil {
		pprof.StartCPUProfile(f)
	}
	code := shim.Main(args, shim.Hooks{})
	if err == nil {
		pprof.StopCPUProfile()
		f.Close()
	}
	os.Exit(code)
}
