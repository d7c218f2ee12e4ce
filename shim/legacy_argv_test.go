package shim

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// TestLegacyArgv: a runnerd that is still running when its runner-shim
// binary is replaced by this one starts shims with the argv of before
// Main's table (flags, then DIR; no mode). The new binary still runs
// them, with and without its own --detach: the session starts, reports
// ready on fd 3 and records its exit.
func TestLegacyArgv(t *testing.T) {
	for _, detach := range []bool{false, true} {
		dir := shimtest.SessionDir(t)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		spec := sessiondir.Spec{ID: "old", Env: shimtest.TestEnv, Argv: []string{"sh", "-c", "echo old; exit 3"}}
		b, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, sessiondir.SpecFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"--ready-fd=3", dir}
		if detach {
			args = append([]string{"--detach"}, args...)
		}
		cmd := exec.Command(shimtest.ShimExe[0], append(shimtest.ShimExe[1:], args...)...)
		cmd.ExtraFiles = []*os.File{w}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		line, err := bufio.NewReader(r).ReadString('\n')
		r.Close()
		if !strings.HasPrefix(line, "ready ") {
			t.Fatalf("detach %v: readiness line %q (%v), want ready", detach, line, err)
		}
		if detach {
			cmd.Wait() // the intermediate exits at once
		}
		if e := shimtest.WaitExit(t, dir); e.Code != 3 {
			t.Errorf("detach %v: got %+v, want exit 3", detach, e)
		}
		if !detach {
			cmd.Wait()
		}
		if got := shimtest.StdoutOf(t, dir); got != "old\n" {
			t.Errorf("detach %v: stdout %q, want %q", detach, got, "old\n")
		}
	}
}
