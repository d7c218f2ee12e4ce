package pod

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/testcap"
)

// The test binary is its own holder program: with asHolderEnv set,
// TestMain runs HolderMain.
const asHolderEnv = "RUNNER_POD_TEST_AS_HOLDER"

func TestMain(m *testing.M) {
	if os.Getenv(asHolderEnv) == "1" {
		os.Exit(HolderMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// testBase is the first id of the blocks the tests use: far from real
// users and from runnerd's identity range.
const testBase = 0x60000000

// newConfig makes the directories of a pod under a fresh temporary
// directory (0700, root's: the holder reaches them only by descriptor).
func newConfig(t *testing.T, name string, block int) Config {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "a pod maps a subordinate id range")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	// /proc/self/exe, not exe: the go build directory above the test
	// binary is 0700 root's, which the holder (not root outside) cannot
	// pass; the magic link is resolved without walking it.
	_ = exe
	cfg := Config{Holder: []string{"/proc/self/exe"}, Env: []string{asHolderEnv + "=1", "GORACE=atexit_sleep_ms=0"}, Name: name,
		UIDBase: testBase + uint32(block)*BlockSize}
	for _, d := range []*string{&cfg.Upper, &cfg.Workspace, &cfg.Tmp, &cfg.VarTmp} {
		dir, err := os.MkdirTemp(root, "d")
		if err != nil {
			t.Fatal(err)
		}
		*d = dir
	}
	return cfg
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create makes a pod and destroys it when the test ends.
func create(t *testing.T, cfg Config) *Pod {
	t.Helper()
	p, err := Create(ctxT(t, 30*time.Second), cfg)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(ctxT(t, 30*time.Second)); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return p
}

// inPodArgv runs argv, an nsenter(1) command whose "-t" value is left
// empty, in the pod.
func inPodArgv(t *testing.T, p *Pod, argv []string) (string, error) {
	t.Helper()
	argv = append([]string(nil), argv...)
	for i := range argv {
		if argv[i] == "-t" {
			argv[i+1] = strconv.Itoa(p.PID())
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// inPod runs sh -c script in the pod with nsenter(1) as uid 0 inside
// (the shim's join is shim/pod_test.go's), and returns its output.
func inPod(t *testing.T, p *Pod, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("nsenter", "-t", strconv.Itoa(p.PID()), "-U", "-m", "-p", "-i", "-u", "-n", "-C", "-S", "0", "-G", "0", "--wdns=/",
		"/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
