package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// TestForkClone: on a btrfs pool a fork of a sandbox's disk now is a
// clone of a snapshot of its volume: no checkpoint of the source is
// made, no snapshot outlives the fork; the fork's workspace is the
// source's (bytes, modes) given to its own identity, setuid cleared, no
// device node; the source's private /tmp does not come with it; its
// budget is the request's; a budget the data does not fit is
// write_failed with no volume or snapshot left; a fork's snapshot a
// crash left is deleted at the next start.
func TestForkClone(t *testing.T) {
	needV1Cgroups(t)
	state := t.TempDir()
	a, p := startPooled(t, state, storage.Btrfs)
	src := a.createSandbox("src")
	wantExit0(t, a, "src", "head -c 12582912 /dev/urandom > big; mkdir -p d/e; printf 'one\\000two' > d/e/f; ln -s d/e/f l; chmod 640 d/e/f")
	// What a command running as root in a sandbox could leave.
	if err := os.WriteFile(filepath.Join(src.WorkspaceOnHost(), "suid-root"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(src.WorkspaceOnHost(), "suid-root"), os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(src.WorkspaceOnHost(), "mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))); err != nil {
		t.Fatal(err)
	}
	// The volume's root-owned rest (the sandbox's private directories)
	// is not the fork's.
	vol := volumePath(state, storage.Btrfs, "src")
	if err := os.MkdirAll(filepath.Join(vol, "private", "leak"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "private", "leak", "secret"), []byte("src's /tmp"), 0o600); err != nil {
		t.Fatal(err)
	}
	stay := a.spawn("src", wire.CreateSession{Argv: []string{"sleep", "60"}})
	before := digest(t, src.WorkspaceOnHost())

	var b wire.Sandbox
	a.must("POST", "/v1/sandboxes", forkReq("b", "src", ""), 200, &b)
	if b.WorkspaceOnHost() != filepath.Join(volumePath(state, storage.Btrfs, "b"), "workspace") || b.Limits == nil || b.Limits.DiskBytes != 64*mib {
		t.Fatalf("fork = %+v, want its own volume with the default 64 MiB budget", b)
	}
	want := strings.Replace(before, "suid-root urwxr-xr-x", "suid-root -rwxr-xr-x", 1)
	var kept []string
	for _, l := range strings.Split(want, "\n") {
		if !strings.HasPrefix(l, "mem ") {
			kept = append(kept, l)
		}
	}
	if got := digest(t, b.WorkspaceOnHost()); got != strings.Join(kept, "\n") {
		t.Errorf("the fork's workspace:\n%s\nwant the source's without setuid and device:\n%s", got, strings.Join(kept, "\n"))
	}
	if bad := ownersOf(t, b.WorkspaceOnHost(), *b.UID, *b.GID); len(bad) > 0 {
		t.Errorf("the fork's entries are not its identity's: %v", bad)
	}
	if _, err := os.Lstat(filepath.Join(volumePath(state, storage.Btrfs, "b"), "private", "leak")); !os.IsNotExist(err) {
		t.Errorf("the fork's volume holds the source's private directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "checkpoints", "src")); !os.IsNotExist(err) {
		t.Errorf("a fork by clone made a checkpoint store for the source: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(state, "storage", "mnt", "snapshots", "*")); len(m) != 0 {
		t.Errorf("snapshots left after the fork: %v", m)
	}
	var ss wire.Session
	a.must("GET", "/v1/sandboxes/src/sessions/"+stay.ID, nil, 200, &ss)
	if ss.State != wire.SessionRunning {
		t.Errorf("the source's session after the fork: %+v, want running (thawed)", ss)
	}
	// Isolated both ways, budgets apart.
	wantExit0(t, a, "b", "echo from-b > d/e/f")
	if out := wantExit0(t, a, "src", "cat d/e/f"); out != "one\x00two" {
		t.Errorf("the fork's write reached the source: %q", out)
	}
	wantWriteRefused(t, a, "b", "more", 56*mib)

	small := forkReq("c", "src", "")
	small.Limits = &wire.Limits{DiskBytes: 8 * mib}
	a.wantError(a.do("POST", "/v1/sandboxes", small), 507, wire.CodeWriteFailed)
	noTrace(t, a, state, "c")
	if _, err := os.Lstat(volumePath(state, storage.Btrfs, "c")); !os.IsNotExist(err) {
		t.Errorf("a failed fork left its volume: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(state, "storage", "mnt", "snapshots", "*")); len(m) != 0 {
		t.Errorf("snapshots left after a failed fork: %v", m)
	}

	// A snapshot a fork took before runnerd died is deleted at start.
	p.kill(syscall.SIGKILL)
	pool, err := storage.Open(context.Background(), storage.Config{Dir: filepath.Join(state, "storage"), Driver: storage.Btrfs, Size: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Snapshot(context.Background(), "src", "fork-00000000deadbeef"); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	a, _ = startPooled(t, state, storage.Btrfs)
	if m, _ := filepath.Glob(filepath.Join(state, "storage", "mnt", "snapshots", "*")); len(m) != 0 {
		t.Errorf("after a restart a fork's orphan snapshot is left: %v", m)
	}
	a.must("GET", "/v1/sandboxes/b", nil, 200, nil)
}
