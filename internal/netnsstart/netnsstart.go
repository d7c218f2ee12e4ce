// Package netnsstart starts a process inside a network namespace from a
// Go program. Namespaces are per thread and a forked child inherits its
// forking thread's, so the start happens on a locked OS thread that is
// switched into the namespace, proven to be there, and switched back; a
// thread that cannot be switched back is left locked, so the runtime ends
// it with its goroutine and no other goroutine ever runs in the
// namespace. The shim starts commands this way and the pod its holder.
package netnsstart

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// Start starts cmd, inside the network namespace at nsPath when it is not
// empty. It returns when cmd.Start has returned.
func Start(cmd *exec.Cmd, nsPath string) error {
	if nsPath == "" {
		return cmd.Start()
	}
	ns, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer ns.Close()
	errc := make(chan error, 1)
	// This goroutine is owned by Start, which waits for it below.
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns %s: %w", nsPath, err)
			return
		}
		// Prove the thread is in the namespace before forking from it: the
		// child inherits the thread's namespace, so this check, unlike one
		// of the child's pid afterwards, cannot race a command that exits
		// at once.
		serr := Same(ns, unix.Gettid())
		if serr == nil {
			serr = cmd.Start()
		}
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: the runtime ends it with this
			// goroutine, so no other goroutine ever runs in the netns.
			errc <- serr
			return
		}
		runtime.UnlockOSThread()
		errc <- serr
	}()
	return <-errc
}

// Same reports an error unless thread tid is in the network namespace
// that ns (an open namespace file) names: same device and inode.
func Same(ns *os.File, tid int) error {
	var want, got unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &want); err != nil {
		return fmt.Errorf("stat netns: %w", err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/self/task/%d/ns/net", tid), &got); err != nil {
		return fmt.Errorf("stat thread netns: %w", err)
	}
	if want.Dev != got.Dev || want.Ino != got.Ino {
		return fmt.Errorf("enter netns: the thread is not in the namespace after setns")
	}
	return nil
}

// StartWith is Start with prep run on the starting thread, after it
// entered the namespace (when nsPath is not empty) and before the fork,
// and the undo it returns run after the fork. prep may change what is the
// thread's alone and the child inherits (the pod holder is forked from a
// thread that unshared its mount namespace and mounted the holder's bind
// sources in it; undo puts the thread back in its first one), so the
// thread is never given back to the runtime: it ends with its goroutine
// (the main thread cannot end: the runtime parks it for good), back in
// the namespaces it had, so that it holds none of the child's alive.
func StartWith(cmd *exec.Cmd, nsPath string, prep func() (undo func() error, err error)) error {
	var ns *os.File
	if nsPath != "" {
		var err error
		if ns, err = os.Open(nsPath); err != nil {
			return fmt.Errorf("open netns: %w", err)
		}
		defer ns.Close()
	}
	errc := make(chan error, 1)
	// This goroutine is owned by StartWith, which waits for it below.
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if ns != nil {
			orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
			if err != nil {
				errc <- fmt.Errorf("open current netns: %w", err)
				return
			}
			defer orig.Close()
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
				errc <- fmt.Errorf("enter netns %s: %w", nsPath, err)
				return
			}
			defer unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET)
			if err := Same(ns, unix.Gettid()); err != nil {
				errc <- err
				return
			}
		}
		undo, err := prep()
		if err == nil {
			err = cmd.Start()
		}
		if undo != nil {
			if uerr := undo(); err == nil && uerr != nil {
				err = uerr
			}
		}
		errc <- err
	}()
	return <-errc
}
