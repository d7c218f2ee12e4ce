package testcap

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// TestRoot: Root lets a root test go on, and skips one that is not root
// (here a copy of this test binary run as nobody) saying it needs root.
func TestRoot(t *testing.T) {
	if os.Getenv("TESTCAP_ROOT_CHILD") == "1" {
		Root(t, "the child is not root")
		t.Fatal("Root returned for a test that is not root")
	}
	if os.Geteuid() != 0 {
		t.Skip("the parent must be root to run the child as nobody")
	}
	Root(t, "the parent is root") // must not skip
	dir, err := os.MkdirTemp("", "testcap-root-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "testcap.test")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestRoot$", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TESTCAP_ROOT_CHILD=1", "CI=", "RUNNER_TEST_REQUIRE_ALL=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if want := "SKIPPED, NOT VERIFIED HERE: needs root: the child is not root"; !strings.Contains(string(out), want) {
		t.Fatalf("child output lacks %q:\n%s", want, out)
	}
}
