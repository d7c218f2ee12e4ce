package daemon_test

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
)

// Forks (#40): POST /v1/sandboxes with from makes a new sandbox whose
// workspace starts as a checkpoint of another, against a real runnerd as
// root (identities on: every sandbox its own uid).

func forkReq(name, from, ck string) wire.CreateSandbox {
	return wire.CreateSandbox{Name: name, From: &wire.ForkFrom{Sandbox: from, Checkpoint: ck}}
}

// ownersOf returns every entry of root whose owner is not uid:gid, and
// every one with a setuid or setgid bit (directories' setgid aside).
func ownersOf(t *testing.T, root string, uid, gid uint32) []string {
	t.Helper()
	var bad []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		if st.Uid != uid || st.Gid != gid {
			bad = append(bad, fmt.Sprintf("%s owned by %d:%d", p, st.Uid, st.Gid))
		}
		if st.Mode&syscall.S_ISUID != 0 || (st.Mode&syscall.S_ISGID != 0 && !d.IsDir()) {
			bad = append(bad, fmt.Sprintf("%s mode %o", p, st.Mode))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

// noTrace checks a failed fork to name left nothing: no record, no
// workspace, no staging, no intent.
func noTrace(t *testing.T, a *api, state, name string) {
	t.Helper()
	a.wantError(a.do("GET", "/v1/sandboxes/"+name, nil), 404, wire.CodeNotFound)
	for _, p := range []string{filepath.Join(state, "sandboxes", name), filepath.Join(state, "sandboxes", ".fork-"+name),
		filepath.Join(state, "forks", name+".json")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("a failed fork left %s (%v)", p, err)
		}
	}
}

func TestForkAPI(t *testing.T) {
	state := t.TempDir()
	a := checkpointDaemon(t, state)
	if !containsStr(a.capabilities(), wire.CapFork) {
		t.Fatalf("capabilities %v: no %s beside %s", a.capabilities(), wire.CapFork, wire.CapCheckpoint)
	}
	src := a.createSandbox("src")
	a.exec("src", wire.Exec{Argv: []string{"sh", "-c", "printf 'one\\000two' > f; chmod 640 f; mkdir -p d/e; echo deep > d/e/g; ln -s f l; chmod 4755 d/e/g"}})
	stay := a.spawn("src", wire.CreateSession{Argv: []string{"sleep", "60"}})
	before := digest(t, src.WorkspaceOnHost())

	// Now: the source is checkpointed, the fork gets that disk, and the
	// checkpoint it took is gone again. Options are the request's.
	var b wire.Sandbox
	req := forkReq("b", "src", "")
	req.Limits = &wire.Limits{Pids: 77}
	a.must("POST", "/v1/sandboxes", req, 200, &b)
	if b.Name != "b" || b.Incarnation == src.Incarnation || b.Limits == nil || b.Limits.Pids != 77 || b.UID == nil || *b.UID == *src.UID {
		t.Fatalf("fork = %+v, want a new sandbox b with pids 77 and its own uid", b)
	}
	// The setuid bit goes (as an import clears it); everything else is
	// the source's, byte for byte.
	want := strings.Replace(before, "d/e/g urwxr-xr-x", "d/e/g -rwxr-xr-x", 1)
	if want == before {
		t.Fatalf("the source holds no setuid d/e/g:\n%s", before)
	}
	if got := digest(t, b.WorkspaceOnHost()); got != want {
		t.Errorf("fork's workspace:\n%s\nwant the source's:\n%s", got, want)
	}
	if bad := ownersOf(t, b.WorkspaceOnHost(), *b.UID, *b.GID); len(bad) > 0 {
		t.Errorf("fork's entries not given to its identity %d:%d: %v", *b.UID, *b.GID, bad)
	}
	if got := digest(t, src.WorkspaceOnHost()); got != before {
		t.Errorf("the source changed:\n%s\nwant\n%s", got, before)
	}
	var list wire.Checkpoints
	a.must("GET", "/v1/sandboxes/src/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 0 {
		t.Errorf("the source lists %+v after a fork from now, want the fork's checkpoint deleted", list.Checkpoints)
	}
	var ss wire.Session
	a.must("GET", "/v1/sandboxes/src/sessions/"+stay.ID, nil, 200, &ss)
	if ss.State != wire.SessionRunning {
		t.Errorf("the source's session after the fork: %+v, want running", ss)
	}
	if _, err := os.Stat(filepath.Join(state, "forks", "b.json")); !os.IsNotExist(err) {
		t.Errorf("the fork's intent outlived it: %v", err)
	}

	// Isolated both ways.
	a.exec("b", wire.Exec{Argv: []string{"sh", "-c", "echo from-b > f; echo new > nb"}})
	a.exec("src", wire.Exec{Argv: []string{"sh", "-c", "echo from-src > d/e/g; echo new > ns"}})
	if r := a.exec("src", wire.Exec{Argv: []string{"sh", "-c", "cat f; test ! -e nb"}}); string(r.Stdout) != "one\x00two" || r.Exit.Code != 0 {
		t.Errorf("b's writes reached the source: %q %+v", r.Stdout, r.Exit)
	}
	if r := a.exec("b", wire.Exec{Argv: []string{"sh", "-c", "cat d/e/g; test ! -e ns"}}); string(r.Stdout) != "deep\n" || r.Exit.Code != 0 {
		t.Errorf("the source's writes reached b: %q %+v", r.Stdout, r.Exit)
	}

	// A named checkpoint: the fork gets it, not the source's disk now;
	// the checkpoint stays.
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/src/checkpoints", wire.CreateCheckpoint{Comment: "kept"}, 201, &ck)
	a.exec("src", wire.Exec{Argv: []string{"sh", "-c", "echo later > f"}})
	var c wire.Sandbox
	a.must("POST", "/v1/sandboxes", forkReq("c", "src", ck.ID), 200, &c)
	if r := a.exec("c", wire.Exec{Argv: []string{"cat", "d/e/g", "ns"}}); string(r.Stdout) != "from-src\nnew\n" {
		t.Errorf("fork of %s reads %q, want the checkpoint's files", ck.ID, r.Stdout)
	}
	if r := a.exec("c", wire.Exec{Argv: []string{"cat", "f"}}); string(r.Stdout) != "one\x00two" {
		t.Errorf("fork of %s reads f %q, want the checkpoint's, not the later write", ck.ID, r.Stdout)
	}
	a.must("GET", "/v1/sandboxes/src/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 1 || list.Checkpoints[0].ID != ck.ID {
		t.Errorf("the source lists %+v, want its own %s kept", list.Checkpoints, ck.ID)
	}

	// Destroying the source keeps the fork whole.
	a.must("DELETE", "/v1/sandboxes/c", nil, 204, nil)
	a.must("POST", "/v1/sandboxes", forkReq("c", "src", ck.ID), 200, &c)

	// Refusals, each before anything is made.
	a.wantError(a.do("POST", "/v1/sandboxes", forkReq("x", "nosuch", "")), 404, wire.CodeNotFound)
	noTrace(t, a, state, "x")
	a.wantError(a.do("POST", "/v1/sandboxes", forkReq("x", "src", "ck-0000000000000000")), 404, wire.CodeNotFound)
	noTrace(t, a, state, "x")
	a.wantError(a.do("POST", "/v1/sandboxes", forkReq("b", "src", "")), 409, wire.CodeInvalid)
	a.wantError(a.do("POST", "/v1/sandboxes", forkReq("src", "src", "")), 400, wire.CodeInvalid)
	a.wantError(a.do("POST", "/v1/sandboxes", forkReq("x", "Bad_Name", "")), 400, wire.CodeInvalid)
	stale := forkReq("x", "src", "")
	stale.From.Incarnation = "0000000000000000"
	a.wantError(a.do("POST", "/v1/sandboxes", stale), 404, wire.CodeNotFound)
	noTrace(t, a, state, "x")
	a.must("GET", "/v1/sandboxes/src/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 1 {
		t.Errorf("refused forks left checkpoints in the source: %+v", list.Checkpoints)
	}
	a.must("DELETE", "/v1/sandboxes/src", nil, 204, nil)
	if r := a.exec("c", wire.Exec{Argv: []string{"cat", "f"}}); string(r.Stdout) != "one\x00two" {
		t.Errorf("after the source's destroy the fork reads %q", r.Stdout)
	}
}

// TestForkCorruptedLeavesNothing: a fork of a checkpoint whose chunk was
// damaged fails restore_failed half-way through writing the new
// workspace, and leaves no record, no workspace, no staging, no intent.
func TestForkCorruptedLeavesNothing(t *testing.T) {
	state := t.TempDir()
	a := checkpointDaemon(t, state)
	src := a.createSandbox("src")
	for i := range 8 {
		randomFile(t, filepath.Join(src.WorkspaceOnHost(), fmt.Sprint("f", i)), byte(i), 256<<10)
	}
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/src/checkpoints", nil, 201, &ck)
	chunks, _ := filepath.Glob(filepath.Join(state, "checkpoints", "src", "chunks", "*", "*"))
	if len(chunks) < 2 {
		t.Fatalf("chunks %v", chunks)
	}
	// The last chunk in name order: others are written before it fails.
	if err := os.WriteFile(chunks[len(chunks)-1], []byte("not zstd"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.wantError(a.do("POST", "/v1/sandboxes", forkReq("bad", "src", ck.ID)), 500, wire.CodeRestoreFailed)
	noTrace(t, a, state, "bad")
}

// TestKillRunnerdDuringFork SIGKILLs a real runnerd while a fork writes
// the new sandbox's workspace: after a restart the half-made sandbox is
// gone (no record, workspace, staging or intent), the checkpoint the
// fork took of its source is deleted, and the same fork then succeeds.
func TestKillRunnerdDuringFork(t *testing.T) {
	needV1Cgroups(t)
	state := t.TempDir()
	a, p := startProcess(t, state)
	src := a.createSandbox("src")
	for i := range 24 {
		randomFile(t, filepath.Join(src.WorkspaceOnHost(), fmt.Sprint("f", i)), byte(i), 1<<20)
	}
	staged := filepath.Join(state, "sandboxes", ".fork-half")
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := strings.NewReader(`{"name":"half","from":{"sandbox":"src"}}`)
		req, _ := http.NewRequest("POST", a.base+"/v1/sandboxes", body)
		req.Header.Set("Authorization", "Bearer "+a.token)
		if resp, err := a.hc.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("the fork answered %d before the kill", resp.StatusCode)
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(filepath.Join(staged, "f0")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fork never staged")
		}
	}
	p.kill(syscall.SIGKILL)
	<-done
	if _, err := os.Stat(filepath.Join(state, "forks", "half.json")); err != nil {
		t.Fatalf("no intent at the kill: %v", err)
	}
	a, _ = startProcess(t, state)
	noTrace(t, a, state, "half")
	var list wire.Checkpoints
	a.must("GET", "/v1/sandboxes/src/checkpoints", nil, 200, &list)
	if len(list.Checkpoints) != 0 {
		t.Errorf("after recovery the source lists %+v, want the fork's checkpoint deleted", list.Checkpoints)
	}
	var b wire.Sandbox
	a.must("POST", "/v1/sandboxes", forkReq("half", "src", ""), 200, &b)
	if got, want := digest(t, b.WorkspaceOnHost()), digest(t, src.WorkspaceOnHost()); got != want {
		t.Errorf("the fork after recovery:\n%s\nwant\n%s", got, want)
	}
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestForkOnPool: on a btrfs storage pool a fork gets a volume of its
// own with the request's budget (never the source's), its files inside
// it; a checkpoint larger than that budget fails write_failed and leaves
// no volume, record, staging or intent.
func TestForkOnPool(t *testing.T) {
	needV1Cgroups(t)
	state := t.TempDir()
	a, _ := startPooled(t, state, storage.Btrfs)
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "src", Limits: &wire.Limits{DiskBytes: 48 * mib}}, 200, nil)
	wantExit0(t, a, "src", "head -c 20971520 /dev/urandom > big; echo small > s")
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/src/checkpoints", nil, 201, &ck)

	var b wire.Sandbox
	req := forkReq("b", "src", ck.ID)
	req.Limits = &wire.Limits{DiskBytes: 40 * mib}
	a.must("POST", "/v1/sandboxes", req, 200, &b)
	if b.Limits == nil || b.Limits.DiskBytes != 40*mib || b.WorkspaceOnHost() != filepath.Join(volumePath(state, storage.Btrfs, "b"), "workspace") {
		t.Fatalf("fork = %+v, want its own volume with disk_bytes %d", b, 40*mib)
	}
	if got, want := wantExit0(t, a, "b", "sha256sum big; cat s"), wantExit0(t, a, "src", "sha256sum big; cat s"); got != want {
		t.Errorf("the fork holds %q, the source %q", got, want)
	}
	// Its budget is its own: 40 MiB less the 20 MiB it holds.
	wantWriteRefused(t, a, "b", "more", 24*mib)

	small := forkReq("c", "src", ck.ID)
	small.Limits = &wire.Limits{DiskBytes: 16 * mib}
	a.wantError(a.do("POST", "/v1/sandboxes", small), 507, wire.CodeWriteFailed)
	noTrace(t, a, state, "c")
	if _, err := os.Lstat(volumePath(state, storage.Btrfs, "c")); !os.IsNotExist(err) {
		t.Errorf("a failed fork left its volume: %v", err)
	}
}
