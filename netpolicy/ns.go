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
// life, whichever thread later uses them.
func inNetNS(ns netns.NsHandle, fn func() error) error {
	return onNetNSThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter netns: %w", err)
		}
		return nil
	}, fn)
}

// newNetNS creates a new network namespace on a locked thread that then
// returns to its own, and returns a handle to it that the caller closes.
// Nothing is left inside it: creating one is all it does.
func newNetNS() (netns.NsHandle, error) {
	nsh := netns.None()
	err := onNetNSThread(func() error {
		h, err := netns.New() // unshare(CLONE_NEWNET) on this thread
		if err != nil {
			return fmt.Errorf("unshare netns: %w", err)
		}
		nsh = h
		return nil
	}, func() error { return nil })
	if err != nil {
		if nsh.IsOpen() {
			nsh.Close()
		}
		return netns.None(), err
	}
	return nsh, nil
}

// onNetNSThread runs fn on a goroutine locked to an OS thread that join
// has moved into another network namespace, moves the thread back to its
// original namespace, and waits for it: the one place a thread changes
// namespace. If join fails the thread has not moved and is released. If
// the thread cannot return to its original namespace it is left locked,
// so the Go runtime retires it instead of reusing a thread in the wrong
// namespace.
func onNetNSThread(join, fn func() error) error {
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
		if err := join(); err != nil {
			runtime.UnlockOSThread()
			errc <- err
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
	nsh, err := newNetNS()
	if err != nil {
		os.Remove(path)
		return err
	}
	defer nsh.Close()
	// The fd table is the process's, so /proc/self/fd names the
	// namespace from whichever thread runs this.
	src := fmt.Sprintf("/proc/self/fd/%d", int(nsh))
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("bind-mount netns: %w", err)
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

// RunInNetNS runs fn on an OS thread that has joined the network
// namespace at path, and waits for it. A process forked by fn (for
// example exec.Cmd.Start called inside fn) is created from that thread and
// starts in that namespace; so do sockets fn opens. Use it to start the
// shim, or the command, inside Sandbox.NetNSPath.
func RunInNetNS(path string, fn func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	return inNetNS(ns, fn)
}

// ProcessInNetNS reports whether process pid runs in the network
// namespace at path, so a caller can verify a spawn landed where it
// should instead of assuming it (advertise or refuse, never pretend).
func ProcessInNetNS(pid int, path string) (bool, error) {
	var want, got unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return false, fmt.Errorf("stat netns %s: %w", path, err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &got); err != nil {
		return false, fmt.Errorf("stat netns of pid %d: %w", pid, err)
	}
	return want.Dev == got.Dev && want.Ino == got.Ino, nil
}
