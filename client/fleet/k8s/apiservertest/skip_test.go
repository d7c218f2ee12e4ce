package apiservertest

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
)

// TestStartWithoutModules: on a cold cache with no module proxy (an empty
// module cache, GOPROXY=off), Start skips loudly, and fails under CI=true,
// naming the missing capability; it never passes silently.
func TestStartWithoutModules(t *testing.T) {
	if os.Getenv("APISERVERTEST_CHILD") == "1" {
		Start(t)
		t.Fatal("Start returned without modules")
	}
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "Start checks root first")
	}
	for _, tc := range []struct {
		name, ci, want string
		wantFail       bool
	}{
		{"developer", "", "SKIPPED, NOT VERIFIED HERE: needs kube-apiserver", false},
		{"ci", "true", "MISSING CAPABILITY kube-apiserver", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestStartWithoutModules$", "-test.v")
			cmd.Env = append(os.Environ(), "APISERVERTEST_CHILD=1", "CI="+tc.ci, "RUNNER_TEST_REQUIRE_ALL=",
				"RUNNER_KUBE_CACHE="+t.TempDir(), "GOMODCACHE="+t.TempDir(), "GOPROXY=off")
			out, err := cmd.CombinedOutput()
			if failed := err != nil; failed != tc.wantFail || !strings.Contains(string(out), tc.want) {
				t.Errorf("child failed=%v (want %v), output lacks %q or has it:\n%s", failed, tc.wantFail, tc.want, out)
			}
		})
	}
}
