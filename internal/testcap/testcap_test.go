package testcap

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSkip runs a child test under each environment and checks whether the
// missing capability skipped it or failed it.
func TestSkip(t *testing.T) {
	if os.Getenv("TESTCAP_CHILD") == "1" {
		Skip(t, "tmux", "no tmux on PATH")
		t.Fatal("Skip returned")
	}
	for _, tc := range []struct {
		name     string
		env      []string
		wantFail bool
	}{
		{"developer", []string{"CI=", "RUNNER_TEST_REQUIRE_ALL="}, false},
		{"ci", []string{"CI=true", "RUNNER_TEST_REQUIRE_ALL="}, true},
		{"required by hand", []string{"CI=", "RUNNER_TEST_REQUIRE_ALL=1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestSkip$", "-test.v")
			cmd.Env = append(append(os.Environ(), "TESTCAP_CHILD=1"), tc.env...)
			out, err := cmd.CombinedOutput()
			failed := err != nil
			if failed != tc.wantFail {
				t.Fatalf("child failed = %v, want %v\n%s", failed, tc.wantFail, out)
			}
			want := "SKIPPED, NOT VERIFIED HERE: needs tmux"
			if tc.wantFail {
				want = "MISSING CAPABILITY tmux"
			}
			if !strings.Contains(string(out), want) {
				t.Errorf("child output lacks %q:\n%s", want, out)
			}
		})
	}
}

// TestAbsent checks that a feature the kernel lacks skips under every
// environment, CI's included, and says so.
func TestAbsent(t *testing.T) {
	if os.Getenv("TESTCAP_CHILD") == "1" {
		Absent(t, "CONFIG_EXAMPLE", "no /proc/sys/example")
		t.Fatal("Absent returned")
	}
	for _, env := range [][]string{{"CI="}, {"CI=true"}, {"RUNNER_TEST_REQUIRE_ALL=1"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAbsent$", "-test.v")
		cmd.Env = append(append(os.Environ(), "TESTCAP_CHILD=1"), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: child failed: %v\n%s", env, err, out)
		}
		if want := "SKIPPED, NOT VERIFIED ON THIS KERNEL: it lacks CONFIG_EXAMPLE"; !strings.Contains(string(out), want) {
			t.Errorf("%v: child output lacks %q:\n%s", env, want, out)
		}
	}
}
