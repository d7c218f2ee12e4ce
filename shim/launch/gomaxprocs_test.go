package launch_test

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// The shim starts with GOMAXPROCS=1 (shimEnv) to keep an idle shim's
// private memory small; the command must never inherit it, whether its
// Spec.Env is empty or names other variables.
func TestShimRunsSmallCommandNeverSeesIt(t *testing.T) {
	for _, env := range [][]string{nil, {"A=1"}} {
		dir, st := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", "env; sleep 0.2"}, Env: env})
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", st.ShimPID))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(append([]byte{0}, b...), []byte("\x00GOMAXPROCS=1\x00")) {
			t.Errorf("shim %d environment lacks GOMAXPROCS=1", st.ShimPID)
		}
		shimtest.WaitExit(t, dir)
		out, _ := shimtest.AttachAll(t, dir, sessiondir.AttachOptions{})
		if bytes.Contains(out[wire.StreamStdout].Bytes(), []byte("GOMAXPROCS")) {
			t.Errorf("env %q: the command saw GOMAXPROCS: %q", env, out[wire.StreamStdout])
		}
	}
}

func TestShimEnvReplacesGOMAXPROCS(t *testing.T) {
	got := launch.ShimEnv([]string{"PATH=/bin", "GOMAXPROCS=8", "X=y"})
	want := []string{"PATH=/bin", "X=y", "GOMAXPROCS=1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}
