package runner

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/internal/testcap"
)

// TestInstallBuildsPodJoin: install.sh builds runnerd and runner-shim
// with cgo (the pod join, package shim/podjoin, is a C constructor: a
// build without it refuses every pod start), with the pure-Go resolver
// and user lookups of a static build, and the client without cgo.
func TestInstallBuildsPodJoin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		testcap.Skip(t, "gcc", "install.sh builds runnerd and runner-shim with cgo (.ci/run installs gcc and libc6-dev)")
	}
	root := t.TempDir()
	cmd := exec.Command("bash", "images/install.sh", "--no-start")
	cmd.Env = append(os.Environ(), "DESTDIR="+root, "CGO_ENABLED=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	for b, want := range map[string][]string{
		"runnerd":     {"\tbuild\tCGO_ENABLED=1\n", "\tbuild\t-tags=netgo,osusergo\n"},
		"runner-shim": {"\tbuild\tCGO_ENABLED=1\n", "\tbuild\t-tags=netgo,osusergo\n"},
		"runner":      {"\tbuild\tCGO_ENABLED=0\n"},
	} {
		out, err := exec.Command("go", "version", "-m", filepath.Join(root, "usr/local/bin", b)).Output()
		if err != nil {
			t.Fatalf("go version -m %s: %v", b, err)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: build info lacks %q:\n%s", b, w, out)
			}
		}
	}
}

// TestInstallNoCompiler: without a C compiler install.sh stops before
// building, says what to install, and installs nothing (a runnerd that
// cannot start pods is never put in place silently).
func TestInstallNoCompiler(t *testing.T) {
	root := t.TempDir()
	cmd := exec.Command("bash", "images/install.sh", "--no-start")
	cmd.Env = append(os.Environ(), "DESTDIR="+root, "CC=/bin/false", "CGO_ENABLED=")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("install.sh with CC=/bin/false: %v, want exit 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "apt-get install gcc libc6-dev") {
		t.Errorf("install.sh does not say what to install:\n%s", out)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("install.sh installed %d entries into DESTDIR", len(ents))
	}
}
