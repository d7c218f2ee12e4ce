package netpolicy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNetNS runs fn on a goroutine locked to an OS thread that has joined
// ns, and waits for it. Sockets created by fn belong to ns for their whole
// life, whichever thread later uses them. If the thread cannot return to
// its original namespace it is left locked, so the Go runtime retires it
// instead of reusing a thread in the wrong namespace.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// createNetNS creates a new network namespace and bind-mounts it at path,
// the way `ip netns add` does, so it outlives every process in it and
// every daemon restart (until reboot or Teardown).
func createNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create netns dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create netns mount point: %w", err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		nsh, err := netns.New() // unshare(CLONE_NEWNET) on this thread
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		defer nsh.Close()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("restore netns: %w", err)
			return // stay locked: the thread dies
		}
		runtime.UnlockOSThread()
		src := fmt.Sprintf("/proc/self/fd/%d", int(nsh))
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount netns: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// isNetNSMount reports whether path is a mounted network namespace (and
// not, say, the empty mount point left over from before a reboot).
func isNetNSMount(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// removeNetNS unmounts and removes the namespace file at path. The
// namespace itself lives on while a process is still inside it; the
// daemon stops the sandbox's processes first. Absent is success.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns file: %w", err)
	}
	return nil
}
