// Package gobuild builds this module's programs for the tests that run
// them as real processes (runnerd, runner, runner-shim, a probe under
// testdata): one `go build` with the compiler's output in the error, the
// version stamp runner's version checks read, and a build shared by every
// test of a test binary.
//
// It is test support: no production code imports it.
package gobuild

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// VersionVar is the variable a version stamp sets (-ldflags -X).
const VersionVar = "github.com/agentrunner/runner/version.Version"

// Build runs go build -o out for pkgs from the current directory (so a
// relative package such as ./testdata/probe is the test's own), stamping
// version into VersionVar unless version is "". out ending in "/" is a
// directory that takes one binary per package. A failure's error carries
// what the compiler said.
func Build(out, version string, pkgs ...string) error {
	args := []string{"build", "-o", out}
	if version != "" {
		args = append(args, "-ldflags", "-X "+VersionVar+"="+version)
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(pkgs, " "), err, b)
	}
	return nil
}

// Once is one Build shared by the tests of a test binary: the first call
// builds, every call (the first included) fails its test if that build
// failed. The zero value is ready; it is safe for concurrent use.
type Once struct {
	once sync.Once
	err  error
}

// Build builds out as Build does, the first time it is called on o, and
// returns out; a later call builds nothing and returns its own out (pass
// the same one). It fails t if the build failed.
func (o *Once) Build(t testing.TB, out, version string, pkgs ...string) string {
	t.Helper()
	o.once.Do(func() { o.err = Build(out, version, pkgs...) })
	if o.err != nil {
		t.Fatal(o.err)
	}
	return out
}
