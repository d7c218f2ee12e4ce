package daemon_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
)

// isClone says the volume of sandbox name is a btrfs snapshot of another
// subvolume (its Parent UUID is set): a fork made by clone, not by copy.
func isClone(t *testing.T, state, name string) bool {
	t.Helper()
	out, err := exec.Command("btrfs", "subvolume", "show", volumePath(state, storage.Btrfs, name)).CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs subvolume show: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "Parent" && f[1] == "UUID:" {
			return f[2] != "-"
		}
	}
	t.Fatalf("no Parent UUID in %s", out)
	return false
}

func snapshotsOf(state string) []string {
	m, _ := filepath.Glob(filepath.Join(state, "storage", "mnt", "snapshots", "*"))
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	return m
}

// TestCheckpointSnapshot: on a btrfs pool a checkpoint of a sandbox
// starts as a pool snapshot named by its id, and is otherwise a
// checkpoint as on every driver: listed, restored, exported and imported
// (into a sandbox of another runnerd's kind: a plain one here), deleted
// with its snapshot. A fork of it is a clone of that snapshot; a fork of
// the same id imported into another sandbox is a copy (the snapshot is
// the source's only), and that sandbox's delete of the id leaves the
// source's snapshot. Destroy deletes the snapshots; one no store lists
// is deleted at the next start.
func TestCheckpointSnapshot(t *testing.T) {
	needV1Cgroups(t)
	state := t.TempDir()
	a, p := startPooled(t, state, storage.Btrfs)
	src := a.createSandbox("src")
	wantExit0(t, a, "src", "head -c 3145728 /dev/urandom > big; printf 'one\\000two' > f; mkdir d; ln -s f d/l")
	stay := a.spawn("src", wire.CreateSession{Argv: []string{"sleep", "60"}})
	before := digest(t, src.WorkspaceOnHost())
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/src/checkpoints", wire.CreateCheckpoint{Comment: "snap"}, 201, &ck)
	if ck.Files != 2 || ck.Size != 3145728+7 || ck.Comment != "snap" {
		t.Errorf("checkpoint = %+v, want 2 files of %d bytes", ck, 3145728+7)
	}
	if got := snapshotsOf(state); len(got) != 1 || got[0] != ck.ID {
		t.Fatalf("pool snapshots %v, want [%s]", got, ck.ID)
	}
	if got := a.checkpointIDs("src"); len(got) != 1 || got[0] != ck.ID {
		t.Errorf("list = %v, want [%s]", got, ck.ID)
	}
	var ss wire.Session
	a.must("GET", "/v1/sandboxes/src/sessions/"+stay.ID, nil, 200, &ss)
	if ss.State != wire.SessionRunning {
		t.Errorf("session after the checkpoint: %+v, want running (thawed)", ss)
	}

	// A fork of it is a clone; its content is the checkpoint's.
	wantExit0(t, a, "src", "echo later > f")
	var b wire.Sandbox
	a.must("POST", "/v1/sandboxes", forkReq("b", "src", ck.ID), 200, &b)
	if !isClone(t, state, "b") {
		t.Errorf("the fork of a snapshot checkpoint is not a clone")
	}
	if got := digest(t, b.WorkspaceOnHost()); got != before {
		t.Errorf("the fork:\n%s\nwant the checkpoint's:\n%s", got, before)
	}

	// Restore clones the files' blocks from the snapshot (the restored
	// big shares them; it was rewritten after the checkpoint, so only a
	// clone can); export and import as on every driver.
	wantExit0(t, a, "src", "head -c 3145728 /dev/urandom > big")
	if shared(t, filepath.Join(src.WorkspaceOnHost(), "big")) {
		t.Fatalf("a rewritten file shares its blocks before the restore")
	}
	a.must("POST", "/v1/sandboxes/src/checkpoints/"+ck.ID+"/restore", nil, 200, nil)
	if got := digest(t, src.WorkspaceOnHost()); got != before {
		t.Errorf("after restore:\n%s\nwant\n%s", got, before)
	}
	if !shared(t, filepath.Join(src.WorkspaceOnHost(), "big")) {
		t.Errorf("the restored big shares no block with the snapshot: copied, not cloned")
	}
	arc := a.export("src", ck.ID, "")
	a.createSandbox("other")
	a.importArchive("other", arc, 201)

	// The same id in another sandbox never reaches src's snapshot.
	var c wire.Sandbox
	a.must("POST", "/v1/sandboxes", forkReq("c", "other", ck.ID), 200, &c)
	if isClone(t, state, "c") {
		t.Errorf("a fork of other's %s cloned src's snapshot", ck.ID)
	}
	a.must("DELETE", "/v1/sandboxes/other/checkpoints/"+ck.ID, nil, 204, nil)
	if got := snapshotsOf(state); len(got) != 1 || got[0] != ck.ID {
		t.Errorf("other's delete of %s: pool snapshots %v, want src's kept", ck.ID, got)
	}

	// Delete removes the snapshot; destroy those of what is left.
	a.must("DELETE", "/v1/sandboxes/src/checkpoints/"+ck.ID, nil, 204, nil)
	if got := snapshotsOf(state); len(got) != 0 {
		t.Errorf("after delete, pool snapshots %v", got)
	}
	a.must("POST", "/v1/sandboxes/src/checkpoints", nil, 201, &ck)
	a.must("DELETE", "/v1/sandboxes/src", nil, 204, nil)
	if got := snapshotsOf(state); len(got) != 0 {
		t.Errorf("after destroy, pool snapshots %v", got)
	}

	// A checkpoint's snapshot no store lists (runnerd died between the
	// snapshot and the index) is deleted at start.
	p.kill(syscall.SIGKILL)
	pool, err := storage.Open(context.Background(), storage.Config{Dir: filepath.Join(state, "storage"), Driver: storage.Btrfs, Size: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Snapshot(context.Background(), "b", "ck-00000000deadbeef"); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	a, _ = startPooled(t, state, storage.Btrfs)
	if got := snapshotsOf(state); len(got) != 0 {
		t.Errorf("after a restart, pool snapshots %v, want the unlisted one deleted", got)
	}
	if _, err := os.Stat(filepath.Join(state, "checkpoints", "b")); !os.IsNotExist(err) {
		t.Errorf("the sweep made a checkpoint store for b: %v", err)
	}
}

// TestKillRunnerdDuringSnapshotCheckpoint SIGKILLs a real runnerd on a
// btrfs pool while a checkpoint's tree is being captured from its
// snapshot: after a restart no checkpoint is listed and no snapshot is
// left, and the next checkpoint works.
func TestKillRunnerdDuringSnapshotCheckpoint(t *testing.T) {
	needV1Cgroups(t)
	state := t.TempDir()
	a, p := startPooled(t, state, storage.Btrfs)
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: "kill", Limits: &wire.Limits{DiskBytes: 96 * mib}}, 200, nil)
	wantExit0(t, a, "kill", "for i in $(seq 24); do head -c 1048576 /dev/urandom > f$i; done")
	store := filepath.Join(state, "checkpoints", "kill")
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest("POST", a.base+"/v1/sandboxes/kill/checkpoints", nil)
		req.Header.Set("Authorization", "Bearer "+a.token)
		if resp, err := a.hc.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("the checkpoint answered %d before the kill", resp.StatusCode)
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if m, _ := filepath.Glob(filepath.Join(store, "chunks", "*", "*")); len(m) > 0 && len(snapshotsOf(state)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the capture never began")
		}
	}
	p.kill(syscall.SIGKILL)
	<-done
	a, _ = startPooled(t, state, storage.Btrfs)
	if got := a.checkpointIDs("kill"); len(got) != 0 {
		t.Errorf("after kill -9 during a checkpoint, list = %v, want none", got)
	}
	if got := snapshotsOf(state); len(got) != 0 {
		t.Errorf("after kill -9 during a checkpoint, pool snapshots %v, want none", got)
	}
	var ck wire.Checkpoint
	a.must("POST", "/v1/sandboxes/kill/checkpoints", nil, 201, &ck)
	if got := snapshotsOf(state); len(got) != 1 || got[0] != ck.ID {
		t.Errorf("pool snapshots %v, want [%s]", got, ck.ID)
	}
}

// shared says file has an extent shared with another file (filefrag's
// "shared" flag: a reflink or a snapshot's block).
func shared(t *testing.T, file string) bool {
	t.Helper()
	exec.Command("sync").Run()
	out, err := exec.Command("filefrag", "-v", file).CombinedOutput()
	if err != nil {
		t.Fatalf("filefrag: %v: %s", err, out)
	}
	return strings.Contains(string(out), "shared")
}
