package testcap

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

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
