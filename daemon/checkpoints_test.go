package daemon_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
)

// checkpointDaemon starts a daemon with cgroups (and so the freezer) and
// insists that it advertises checkpoints.
func checkpointDaemon(t *testing.T, state string) *api {
	t.Helper()
	needV1Cgroups(t)
	a := startDaemonCfg(t, daemon.Config{StateDir: state, Token: testToken, NetPolicy: daemon.NetPolicyOff})
	if !slices.Contains(a.capabilities(), wire.CapCheckpoint) {
		t.Fatalf("capabilities %v: no %s on a root host with the freezer", a.capabilities(), wire.CapCheckpoint)
	}
	return a
}

// digest is a tree's content as the tests compare it.
func digest(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, _ := d.Info()
		fmt.Fprintf(&b, "%s %v", rel, fi.Mode())
		if fi.Mode().IsRegular() {
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %x", sha256.Sum256(c))
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func randomFile(t *testing.T, p string, seed byte, n int) {
	t.Helper()
	var key [32]byte
	key[0] = seed
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCheckpointAPI(t *testing.T) {
	a := checkpointDaemon(t, t.TempDir())
	sb := a.createSandbox("ck")
	a.exec("ck", wire.Exec{Argv: []string{"sh", "-c", "printf 'one\\000two' > f; echo keep > g"}})
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/ck/checkpoints", wire.CreateCheckpoint{Comment: "before the risky turn"}, 201, &ck)
	if ck.ID == "" || ck.Sandbox != "ck" || ck.Comment != "before the risky turn" || ck.Size != 12 || ck.Files != 2 || ck.StoredBytes == 0 || ck.Created.IsZero() {
		t.Fatalf("checkpoint = %+v", ck)
	}
	var list wire.Checkpoints
	a.must("GET", "/v1/sandboxes/ck/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 1 || list.Checkpoints[0].ID != ck.ID {
		t.Fatalf("list = %+v, want [%s]", list, ck.ID)
	}
	var got wire.Checkpoint
	a.must("GET", "/v1/sandboxes/ck/checkpoints/"+ck.ID, nil, 200, &got)
	if got.ID != ck.ID || got.StoredBytes != ck.StoredBytes {
		t.Errorf("get = %+v, want %+v", got, ck)
	}
	a.wantError(a.do("GET", "/v1/sandboxes/ck/checkpoints/ck-0000000000000000", nil), 400, wire.CodeInvalid)
	a.wantError(a.do("POST", "/v1/sandboxes/ck/checkpoints/nope/restore", nil), 400, wire.CodeInvalid)
	a.wantError(a.do("POST", "/v1/sandboxes/nosuch/checkpoints", nil), 404, wire.CodeNotFound)
	a.wantError(a.do("POST", "/v1/sandboxes/ck/checkpoints", wire.CreateCheckpoint{Comment: strings.Repeat("x", wire.MaxCheckpointComment+1)}), 400, wire.CodeInvalid)

	// A session that survives would lose its disk under it: restore parks
	// the sandbox (the session ends as a suspend ends it) and resumes it.
	stay := a.spawn("ck", wire.CreateSession{Argv: []string{"sleep", "60"}})
	a.exec("ck", wire.Exec{Argv: []string{"sh", "-c", "echo changed > f; rm g; echo new > h"}})
	var after wire.Sandbox
	a.must("POST", "/v1/sandboxes/ck/checkpoints/"+ck.ID+"/restore", nil, 200, &after)
	if after.State != wire.SandboxRunning {
		t.Errorf("after restore the sandbox is %s, want running again", after.State)
	}
	if s := a.waitEnded("ck", stay.ID); s.State != wire.SessionExited {
		t.Errorf("session across a restore: %+v, want exited (terminated)", s)
	}
	res := a.exec("ck", wire.Exec{Argv: []string{"sh", "-c", "cat f; cat g; test ! -e h"}})
	if string(res.Stdout) != "one\x00twokeep\n" || res.Exit.Code != 0 {
		t.Errorf("after restore: stdout %q exit %+v, want the checkpoint's files only", res.Stdout, res.Exit)
	}

	a.must("DELETE", "/v1/sandboxes/ck/checkpoints/"+ck.ID, nil, 204, nil)
	a.must("DELETE", "/v1/sandboxes/ck/checkpoints/"+ck.ID, nil, 204, nil)
	a.must("GET", "/v1/sandboxes/ck/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 0 {
		t.Errorf("list after delete = %+v", list)
	}

	// Destroy removes checkpoints, unless asked to keep them.
	store := filepath.Join(filepath.Dir(filepath.Dir(sb.WorkspaceOnHost())), "checkpoints", "ck")
	a.must("POST", "/v1/sandboxes/ck/checkpoints", nil, 201, &ck)
	a.must("DELETE", "/v1/sandboxes/ck?keep_checkpoints=true", nil, 204, nil)
	if _, err := os.Stat(filepath.Join(store, "index.json")); err != nil {
		t.Errorf("keep_checkpoints: %v", err)
	}
	a.createSandbox("ck")
	a.must("GET", "/v1/sandboxes/ck/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 1 || list.Checkpoints[0].ID != ck.ID {
		t.Errorf("a sandbox re-created under the name lists %+v, want the kept %s", list, ck.ID)
	}
	a.must("DELETE", "/v1/sandboxes/ck", nil, 204, nil)
	if _, err := os.Stat(store); !os.IsNotExist(err) {
		t.Errorf("destroy left the checkpoints: %v", err)
	}
}

// TestCheckpointSessionLosesNoByte checkpoints a sandbox several times
// while a session prints a counter as fast as it can: the frozen session
// resumes where it was, and its output has every line once, in order.
func TestCheckpointSessionLosesNoByte(t *testing.T) {
	a := checkpointDaemon(t, t.TempDir())
	a.createSandbox("busy")
	const n = 20000
	s := a.spawn("busy", wire.CreateSession{Argv: []string{"sh", "-c", `i=0; while [ $i -lt ` + strconv.Itoa(n) + ` ]; do echo $i; echo $i >> log; i=$((i+1)); done`}})
	for range 3 {
		var ck wire.Checkpoint
		a.must("POST", "/v1/sandboxes/busy/checkpoints", nil, 201, &ck)
		t.Logf("checkpoint %s frozen %d ms", ck.ID, ck.FrozenMS)
	}
	if e := a.waitEndedWithin("busy", s.ID, 60*time.Second); e.Exit == nil || e.Exit.Code != 0 {
		t.Fatalf("session = %+v, want exit 0", e)
	}
	r := a.do("GET", "/v1/sandboxes/busy/sessions/"+s.ID+"/streams/stdout", nil)
	var want bytes.Buffer
	for i := range n {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if !bytes.Equal(r.body, want.Bytes()) {
		t.Errorf("stdout has %d bytes, want %d: a byte was lost or repeated across the freezes", len(r.body), want.Len())
	}
}

// TestCheckpointDiskFull: checkpoint storage on a full file system is a
// 507 write_failed and leaves nothing of the attempt.
func TestCheckpointDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "mounting a tmpfs")
	}
	state := t.TempDir()
	store := filepath.Join(state, "checkpoints")
	os.Mkdir(store, 0o700)
	if err := syscall.Mount("tmpfs", store, "tmpfs", 0, "size=1m"); err != nil {
		testcap.Skip(t, "tmpfs", err.Error())
	}
	t.Cleanup(func() { syscall.Unmount(store, syscall.MNT_DETACH) })
	a := checkpointDaemon(t, state)
	sb := a.createSandbox("full")
	randomFile(t, filepath.Join(sb.WorkspaceOnHost(), "big"), 1, 3<<20)
	r := a.do("POST", "/v1/sandboxes/full/checkpoints", nil)
	a.wantError(r, 507, wire.CodeWriteFailed)
	var list wire.Checkpoints
	a.must("GET", "/v1/sandboxes/full/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 0 {
		t.Errorf("list after a failed checkpoint = %+v", list)
	}
	var left []string
	filepath.WalkDir(filepath.Join(store, "full"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Errorf("a failed checkpoint left %v", left)
	}
}

// TestKillRunnerdDuringCheckpointAndRestore SIGKILLs a real runnerd while
// a checkpoint is writing chunks, and again while a restore is staging or
// swapping: after a restart no partial checkpoint is listed, and the
// workspace is the old tree or the checkpoint's, never a mix.
func TestKillRunnerdDuringCheckpointAndRestore(t *testing.T) {
	needV1Cgroups(t)
	state := t.TempDir()
	a, p := startProcess(t, state)
	sb := a.createSandbox("kill")
	for i := range 24 {
		randomFile(t, filepath.Join(sb.WorkspaceOnHost(), fmt.Sprint("f", i)), byte(i), 1<<20)
	}
	store := filepath.Join(state, "checkpoints", "kill")
	killWhen := func(cond func() bool, call func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); call() }()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the step never came")
			}
		}
		p.kill(syscall.SIGKILL)
		<-done
	}
	hasChunk := func() bool {
		m, _ := filepath.Glob(filepath.Join(store, "chunks", "*", "*"))
		return len(m) > 0
	}
	// The killed call's answer is an EOF: post without a.do, which fails
	// the test on a transport error.
	post := func(a *api, path string) func() {
		return func() {
			req, _ := http.NewRequest("POST", a.base+path, nil)
			req.Header.Set("Authorization", "Bearer "+a.token)
			if resp, err := a.hc.Do(req); err == nil {
				resp.Body.Close()
				t.Errorf("POST %s answered %d before the kill", path, resp.StatusCode)
			}
		}
	}
	killWhen(hasChunk, post(a, "/v1/sandboxes/kill/checkpoints"))
	a, p = startProcess(t, state)
	var list wire.Checkpoints
	a.must("GET", "/v1/sandboxes/kill/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 0 {
		t.Fatalf("after kill -9 during a checkpoint, list = %+v, want none", list)
	}

	old := digest(t, sb.WorkspaceOnHost())
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/kill/checkpoints", nil, 201, &ck)
	for i := range 24 {
		randomFile(t, filepath.Join(sb.WorkspaceOnHost(), fmt.Sprint("f", i)), byte(100+i), 1<<20)
	}
	changed := digest(t, sb.WorkspaceOnHost())
	staged := filepath.Join(filepath.Dir(sb.WorkspaceOnHost()), ".restore-kill")
	killWhen(func() bool { _, err := os.Stat(staged); return err == nil },
		post(a, "/v1/sandboxes/kill/checkpoints/"+ck.ID+"/restore"))
	a, p = startProcess(t, state)
	switch got := digest(t, sb.WorkspaceOnHost()); got {
	case old:
		t.Log("recovered to the checkpoint")
	case changed:
		t.Log("recovered to the disk before the restore")
	default:
		t.Fatalf("after kill -9 during a restore the workspace is a mix:\n%s", got)
	}
	for _, leftover := range []string{staged, filepath.Join(filepath.Dir(sb.WorkspaceOnHost()), ".old-kill"), filepath.Join(store, "restore.json")} {
		if _, err := os.Stat(leftover); !os.IsNotExist(err) {
			t.Errorf("recovery left %s: %v", leftover, err)
		}
	}
	a.must("DELETE", "/v1/sandboxes/kill", nil, 204, nil)
}

// TestCheckpointIsOneInstant: a session bumps a counter in file a, then
// the same in file z, as fast as it can; 8 MiB of other files lie between
// them in the walk. The checkpoint, restored, must hold z == a or
// z == a-1: the processes were frozen for the whole capture.
func TestCheckpointIsOneInstant(t *testing.T) {
	a := checkpointDaemon(t, t.TempDir())
	sb := a.createSandbox("instant")
	for i := range 8 {
		randomFile(t, filepath.Join(sb.WorkspaceOnHost(), fmt.Sprint("m", i)), byte(i), 1<<20)
	}
	s := a.spawn("instant", wire.CreateSession{Argv: []string{"sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > a.t; mv a.t a; echo $i > z.t; mv z.t z; done`}})
	for {
		if b, _ := os.ReadFile(filepath.Join(sb.WorkspaceOnHost(), "z")); len(b) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/instant/checkpoints", nil, 201, &ck)
	a.must("POST", "/v1/sandboxes/instant/checkpoints/"+ck.ID+"/restore", nil, 200, nil)
	a.waitEnded("instant", s.ID)
	read := func(name string) int {
		b, err := os.ReadFile(filepath.Join(sb.WorkspaceOnHost(), name))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	if av, zv := read("a"), read("z"); zv != av && zv != av-1 {
		t.Errorf("checkpoint holds a=%d z=%d: not one instant", av, zv)
	}
}
