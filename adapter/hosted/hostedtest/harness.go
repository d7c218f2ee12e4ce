package hostedtest

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/conformance"
)

// BuildShim builds cmd/runner-shim reporting version into path, static
// (CGO off), for the guests of the stand-ins.
func BuildShim(path, version string) error {
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/agentrunner/runner/version.Version="+version,
		"-o", path, "github.com/agentrunner/runner/cmd/runner-shim")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/runner-shim: %v\n%s", err, out)
	}
	return nil
}

// Conformance runs the provider-neutral suite (adapter/conformance, the
// shell fixtures, 90 s per test) with a fresh stand-in per test:
// newSubject makes it, and its first adapter is the one under test.
func Conformance(t *testing.T, newSubject func(tb testing.TB) Subject) {
	conformance.Run(t, conformance.Harness{
		New: func(ct conformance.T) conformance.Subject {
			tb := ct.(testing.TB)
			s := newSubject(tb)
			return conformance.Subject{Adapter: s.New(tb), Outage: s.Outage, InterruptList: s.InterruptList, CorruptCheckpoint: s.CorruptCheckpoint}
		},
		Fixtures: conformance.ShellFixtures(),
		Timeout:  90 * time.Second,
	})
}
