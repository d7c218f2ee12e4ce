package daemon_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/shim/podjoin"
	"github.com/agentrunner/runner/wire"
)

// tool returns the path at which sandbox's commands run the test binary
// bin (built next to runnerd, under the test's /tmp). A pod sees none of
// the host's /tmp (docs/isolation.md, "The pod"), so for a pod bin is
// copied into the sandbox's workspace on the host, mode 0755, owned by
// the sandbox's root, and run as /workspace/NAME; any other sandbox runs
// it where it is.
func (a *api) tool(sandbox, bin string) string {
	a.t.Helper()
	var sb wire.Sandbox
	a.must("GET", "/v1/sandboxes/"+sandbox, nil, 200, &sb)
	return podTool(a.t, sb, bin)
}

// podTool is tool for a sandbox already read.
func podTool(t *testing.T, sb wire.Sandbox, bin string) string {
	t.Helper()
	if !sb.Pod {
		return bin
	}
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(bin)
	dst := filepath.Join(sb.WorkspaceOnHost(), name)
	if err := os.WriteFile(dst, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if sb.UID != nil && sb.GID != nil {
		if err := os.Lchown(dst, int(*sb.UID), int(*sb.GID)); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(sb.Workspace, name)
}

// rootDefaultIsolation is the isolation a root runnerd told nothing runs
// (daemon.Config.Isolate empty): pods where they can be made (user
// namespaces on, runnerd built with cgo, as this test binary is or not),
// else uid isolation.
func rootDefaultIsolation() string {
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if !podjoin.Supported || err != nil || strings.TrimSpace(string(b)) == "0" {
		return daemon.IsolateAll
	}
	return daemon.IsolatePod
}

// stateCgroupRoots holds the cgroup root of each state directory a test
// started a runnerd process on (stateCgroupRoot).
var stateCgroupRoots sync.Map // state directory -> cgroup root

// stateCgroupRoot is the test cgroup root for runnerds on state: the same
// for every runnerd of one test on one state directory, as a real
// runnerd's is across restarts. A pod's holder and the sessions it forks
// live in the sandbox's cgroup under the root the pod was made in; a
// restarted runnerd under another root adopts the holder but freezes,
// limits and kills an empty cgroup (a restore then waited for a holder
// frozen under the old root: "end the pod ...: wait for ...").
func stateCgroupRoot(t *testing.T, state string) string {
	t.Helper()
	if root, ok := stateCgroupRoots.Load(state); ok {
		return root.(string)
	}
	root := testCgroupRoot(t)
	stateCgroupRoots.Store(state, root)
	t.Cleanup(func() { stateCgroupRoots.Delete(state) })
	return root
}

// holderTasks is how many tasks a pod's holder has in the sandbox's pids
// cgroup dir (its leaf _pod: the holder process and its threads, counted
// against the sandbox's pids.max and in its usage like any of its tasks);
// 0 for a sandbox that is not a pod (no such leaf).
func holderTasks(t *testing.T, sandboxPidsDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sandboxPidsDir, "_pod", "pids.current"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// smallMemory is the memory limit of the tests' small sandboxes (OOM
// kills, leaf release). A pod's holder and each session's helper are
// runnerd's own program in the sandbox's memory cgroup; built with the
// race detector, as these tests build runnerd under -race, they need
// more than the 32 MiB these tests had ("nsexec: the helper ended before
// executing the command"). The hogs grow until killed, at any limit.
const smallMemory = 128 << 20
