package runner

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
)

// TestInstallWithoutSystemd runs `sudo images/install.sh` as on a host
// that does not run systemd (a container, another init: systemctl may
// still be installed, as here). It used to end "start with: systemctl
// enable --now runnerd" (or, with systemctl present, fail in `systemctl
// daemon-reload`); it must install, exit 0, start nothing, and say how
// to start runnerd without systemd. systemd is hidden by a tmpfs over
// /run/systemd in a mount namespace of the test's, and every path the
// script writes is under the test's directory (BINDIR, UNITDIR, DOCDIR).
func TestInstallWithoutSystemd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries")
	}
	testcap.Root(t, "the test hides systemd in a mount namespace of its own")
	dir := t.TempDir()
	bindir := filepath.Join(dir, "bin")
	script := `set -e
if [ -d /run/systemd ]; then mount -t tmpfs none /run/systemd; fi
exec bash images/install.sh`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "DESTDIR=", "BINDIR="+bindir,
		"UNITDIR="+filepath.Join(dir, "unit"), "DOCDIR="+filepath.Join(dir, "doc"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("install.sh without systemd: %v, want exit 0\n%s", err, out)
	}
	text := string(out)
	if strings.Contains(text, "systemctl") {
		t.Errorf("install.sh without systemd tells to use systemctl:\n%s", text)
	}
	for _, want := range []string{
		"this host does not run systemd, so nothing was started",
		"  " + bindir + "/runnerd --shim " + bindir + "/runner-shim\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("install.sh output lacks %q:\n%s", want, text)
		}
	}
	if _, err := os.Stat(filepath.Join(bindir, "runnerd")); err != nil {
		t.Errorf("runnerd not installed: %v", err)
	}
}
