package shim

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/internal/shimtest"
	"github.com/agentrunner/runner/shim/sessiondir"
)

// podBase is the first id of the blocks these tests map (pod's own tests
// use 0x60000000).
const podBase = 0x61000000

// testPod is a pod made by the test binary (its own holder program: the
// shim's pod mode) and its directories.
type testPod struct {
	*pod.Pod
	cfg pod.Config
}

// newPod makes a pod named name with block k of podBase and destroys it
// at the test's end.
func newPod(t *testing.T, name string, k int) *testPod {
	t.Helper()
	shimtest.NeedRoot(t)
	root := t.TempDir()
	// /proc/self/exe: the go build directory above the test binary is
	// root's, 0700, which the holder cannot pass.
	cfg := pod.Config{Holder: []string{"/proc/self/exe", "pod"}, Env: []string{shimtest.AsShimEnv + "=1", "GORACE=atexit_sleep_ms=0"},
		Name: name, UIDBase: podBase + uint32(k)*pod.BlockSize}
	for _, d := range []*string{&cfg.Upper, &cfg.Workspace, &cfg.Tmp, &cfg.VarTmp} {
		dir, err := os.MkdirTemp(root, "d")
		if err != nil {
			t.Fatal(err)
		}
		*d = dir
	}
	p, err := pod.Create(shimtest.CtxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("pod.Create: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(shimtest.CtxT(t, 30*time.Second)); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return &testPod{p, cfg}
}

func (p *testPod) ref() *sessiondir.PodRef {
	return &sessiondir.PodRef{PID: p.PID(), StartTime: p.StartTime()}
}

// runIn runs sh -c script in the pod through a shim and returns its exit
// and its stdout and stderr merged.
func runIn(t *testing.T, p *testPod, script string) (journal.Exit, string) {
	t.Helper()
	dir, _ := shimtest.Start(t, sessiondir.Spec{Argv: []string{"sh", "-c", script}, Pod: p.ref(), MergeStderr: true, Dir: pod.WorkspacePath})
	e := shimtest.WaitExit(t, dir)
	return e, shimtest.StdoutOf(t, dir)
}

func TestPodSmoke(t *testing.T) {
	if testcap.Required() {
		t.Skip("smoke")
	}
	p := newPod(t, "smoke", 0)
	e, out := runIn(t, p, "id; hostname; pwd; ps -ef; grep -i 'seccomp\\|nonew\\|uid' /proc/self/status; exit 7")
	t.Logf("%+v\n%s", e, out)
	_ = strings.Contains
}
