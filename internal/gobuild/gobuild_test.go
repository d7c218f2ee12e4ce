package gobuild

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildStamps: the binary Build makes carries the version asked for,
// and one built without a version carries none (version.Version empty).
func TestBuildStamps(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, version string }{{"stamped", "v7.7.7-gobuild"}, {"plain", ""}} {
		bin := filepath.Join(dir, tc.name)
		if err := Build(bin, tc.version, "./testdata/stamp"); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := string(out); got != tc.version {
			t.Errorf("%s: version %q, want %q", tc.name, got, tc.version)
		}
	}
}

// TestBuildFailureSaysWhy: a build that fails returns the compiler's
// words, not only an exit status.
func TestBuildFailureSaysWhy(t *testing.T) {
	err := Build(filepath.Join(t.TempDir(), "x"), "", "./testdata/nosuch")
	if err == nil || !strings.Contains(err.Error(), "nosuch") || !strings.Contains(err.Error(), "exit status") {
		t.Fatalf("Build of a missing package: %v, want go build's complaint naming it", err)
	}
}
