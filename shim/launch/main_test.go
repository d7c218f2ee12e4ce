package launch_test

import (
	"os"
	"testing"

	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/shim/internal/shimtest"
)

func TestMain(m *testing.M) {
	os.Exit(shimtest.Run(m, func(args []string) int { return shim.Main(args, shim.Hooks{}) }, map[string]func() int{poolHelperEnv: poolHelper}))
}
