package daemon_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agentrunner/runner/wire"
	"golang.org/x/sys/unix"
)

// TestHostileForkSource: a source sandbox's disk holds what a command
// running as root there could leave (a setuid-root program, a
// root-owned file, a device node, a fifo, a file of another uid): the
// fork, an isolated sandbox, gets every file as its own identity's with
// setuid and setgid cleared, and no device node or fifo at all. Without
// the remap (Materialize with no owner) the fork would hold a setuid-root
// program its identity can run.
func TestHostileForkSource(t *testing.T) {
	state := t.TempDir()
	a := checkpointDaemon(t, state)
	src := a.createSandbox("src")
	ws := src.WorkspaceOnHost()
	mk := func(rel string, mode os.FileMode, uid int) {
		t.Helper()
		p := filepath.Join(ws, rel)
		if err := os.WriteFile(p, []byte("#!/bin/sh\nid\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("suid-root", os.ModeSetuid|0o755, 0)
	mk("sgid-other", os.ModeSetgid|0o755, 4242)
	mk("root-only", 0o600, 0)
	if err := unix.Mknod(filepath.Join(ws, "mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(ws, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}

	var b wire.Sandbox
	a.must("POST", "/v1/sandboxes", forkReq("b", "src", ""), 200, &b)
	if b.UID == nil {
		t.Fatalf("fork %+v has no identity of its own", b)
	}
	if bad := ownersOf(t, b.WorkspaceOnHost(), *b.UID, *b.GID); len(bad) > 0 {
		t.Errorf("the fork holds entries not its identity's, or setuid/setgid: %v", bad)
	}
	for _, gone := range []string{"mem", "fifo"} {
		if _, err := os.Lstat(filepath.Join(b.WorkspaceOnHost(), gone)); !os.IsNotExist(err) {
			t.Errorf("the fork holds %s (%v), want no device node or fifo", gone, err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(b.WorkspaceOnHost(), "suid-root"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o755 {
		t.Errorf("suid-root mode %o, want 0755", st.Mode&0o7777)
	}
	// The fork's identity reads and runs what it now owns.
	if r := a.exec("b", wire.Exec{Argv: []string{"sh", "-c", "cat root-only >/dev/null && ./suid-root"}}); r.Exit.Code != 0 {
		t.Errorf("the fork's own files: exit %+v, stderr %q", r.Exit, r.Stderr)
	}
}
