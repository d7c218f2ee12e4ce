package registry_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/wire"
)

// fullRegistry opens a registry with a reserve on a fresh 4 MiB tmpfs,
// gives it a sandbox with many session records, then fills the file
// system to the last byte with another file.
func fullRegistry(t *testing.T, withReserve bool) (*registry.Registry, string) {
	t.Helper()
	testcap.Root(t, "mounts a sized tmpfs to fill the registry's file system")
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	r, err := registry.Open(filepath.Join(dir, "registry.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if withReserve {
		if err := r.SetReserve(filepath.Join(dir, "registry.reserve"), 512<<10); err != nil {
			t.Fatal(err)
		}
		if !r.HasReserve() {
			t.Fatal("reserve not set aside on an empty file system")
		}
	}
	if _, _, err := r.CreateSandbox(registry.Sandbox{Name: "box"}); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		s := registry.Session{Sandbox: "box", ID: fmt.Sprintf("s%03d", i), Key: fmt.Sprintf("k%03d", i), State: wire.SessionRunning,
			Request: wire.CreateSession{Argv: []string{"sh", "-c", strings.Repeat("x", 400)}}, StartedAt: time.Now()}
		if _, err := r.CreateSession(s, nil); err != nil {
			t.Fatal(err)
		}
	}
	fill(t, filepath.Join(dir, "filler"))
	return r, dir
}

// fill writes path until its file system has not one byte left.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for _, n := range []int{len(buf), 4096, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
}

// TestReserveFullDisk: on a file system filled to the last byte, the
// commits that end and remove things (recording every session's exit,
// deleting the sandbox) land by releasing the reserve, a create is
// refused ENOSPC without touching it, and once space is back the reserve
// is set aside again. Without the reserve the same commits fail ENOSPC
// (the second case), which is what the reserve is for.
func TestReserveFullDisk(t *testing.T) {
	ids := make([]string, 300)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%03d", i)
	}
	ended := func(s *registry.Session) {
		s.State = wire.SessionExited
		s.Exit = &wire.Exit{Reason: "signaled", Code: 137, Signal: 9, Detail: strings.Repeat("d", 300), Terminated: true}
	}

	t.Run("reserve", func(t *testing.T) {
		r, dir := fullRegistry(t, true)
		if _, _, err := r.CreateSandbox(registry.Sandbox{Name: "new", Workspace: strings.Repeat("w", 3000)}); !errors.Is(err, syscall.ENOSPC) {
			// A create may fit in a free page; it must never take the reserve.
			if err != nil {
				t.Fatalf("create on a full disk: got %v, want ENOSPC or success", err)
			}
		}
		if !r.HasReserve() {
			t.Fatal("a create took the reserve")
		}
		if err := r.UpdateSessions("box", ids, ended); err != nil {
			t.Fatalf("record exits on a full disk: %v", err)
		}
		if err := r.DeleteSandbox("box"); err != nil {
			t.Fatalf("delete on a full disk: %v", err)
		}
		if _, err := r.GetSandbox("box"); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("after delete: got %v, want ErrNotFound", err)
		}
		if held, err := r.ReplenishReserve(); err != nil || held {
			t.Fatalf("replenish on a full disk: got %v %v, want not held, no error", held, err)
		}
		if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
			t.Fatal(err)
		}
		if held, err := r.ReplenishReserve(); err != nil || !held || !r.HasReserve() {
			t.Fatalf("replenish with space back: got %v %v, want held", held, err)
		}
	})
	t.Run("no reserve", func(t *testing.T) {
		r, _ := fullRegistry(t, false)
		err := r.UpdateSessions("box", ids, ended)
		if err == nil {
			err = r.DeleteSandbox("box")
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("without a reserve: got %v, want ENOSPC (else this test proves nothing)", err)
		}
	})
}
