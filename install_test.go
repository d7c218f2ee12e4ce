package runner

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallScript stages images/install.sh into a temporary root, the way
// a packager would, and checks that it installs the three binaries and a
// unit that starts runnerd without ever killing session shims.
func TestInstallScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries")
	}
	root := t.TempDir()
	cmd := exec.Command("bash", "images/install.sh", "--no-start")
	cmd.Env = append(os.Environ(), "DESTDIR="+root, "BINDIR=/opt/runner/bin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	for _, b := range []string{"runnerd", "runner", "runner-shim"} {
		fi, err := os.Stat(filepath.Join(root, "opt/runner/bin", b))
		if err != nil {
			t.Fatalf("binary %s not installed: %v", b, err)
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode = %v, want 0755", b, fi.Mode().Perm())
		}
	}
	out, err := exec.Command(filepath.Join(root, "opt/runner/bin/runnerd"), "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: runnerd") {
		t.Errorf("installed runnerd --help: %v\n%s", err, out)
	}
	unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/runnerd.service"))
	if err != nil {
		t.Fatalf("unit not installed: %v", err)
	}
	for _, want := range []string{
		"ExecStart=/opt/runner/bin/runnerd\n", // BINDIR is honoured
		"Type=notify\n",
		"KillMode=process\n", // stopping runnerd must not kill the turns
		"StateDirectory=runnerd\n",
	} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("installed unit lacks %q", strings.TrimSpace(want))
		}
	}
}
