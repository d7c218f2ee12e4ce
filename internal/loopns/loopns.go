// Package loopns is a network namespace of a test's own whose only
// interface is loopback: the real servers tests start (kube-apiserver and
// etcd, an S3 server) listen there, where nothing else on the host can
// reach them and their default ports never clash, and the test dials them
// through the namespace. It is test support: no production code imports it.
package loopns

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// NS is a network namespace of the test's own, held by an open file
// (no name under /var/run/netns: nothing outside the test finds it). Its
// only interface is loopback, brought up.
type NS struct {
	f *os.File
}

// New makes a network namespace and brings its loopback up.
func New() (*NS, error) {
	var ns *NS
	err := onLockedThread(func() error {
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			return fmt.Errorf("open own netns: %w", err)
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare netns: %w", err)
		}
		f, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err == nil {
			err = loopbackUp()
		}
		if back := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); back != nil {
			return errThreadTainted{fmt.Errorf("return to own netns: %w", back)}
		}
		if err != nil {
			if f != nil {
				f.Close()
			}
			return fmt.Errorf("set up netns: %w", err)
		}
		ns = &NS{f: f}
		return nil
	})
	return ns, err
}

// loopbackUp sets lo up in the calling thread's netns.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// errThreadTainted is an error after which the locked thread is left in
// another namespace: onLockedThread then keeps it locked, so the runtime
// ends the thread with the goroutine instead of reusing it.
type errThreadTainted struct{ error }

func (e errThreadTainted) Unwrap() error { return e.error }

// onLockedThread runs fn on a goroutine locked to its OS thread and
// waits for it. The thread is unlocked afterwards unless fn says it is
// tainted.
func onLockedThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := fn()
		if _, tainted := err.(errThreadTainted); !tainted {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// Do runs fn with the calling goroutine's thread in the netns, and
// returns it to its own netns after.
func (ns *NS) Do(fn func() error) error {
	return onLockedThread(func() error {
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			return fmt.Errorf("open own netns: %w", err)
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.f.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter test netns: %w", err)
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			return errThreadTainted{fmt.Errorf("return to own netns: %w", err)}
		}
		return ferr
	})
}

// Start starts cmd inside the netns: the child is forked from a thread
// that is in it, and inherits it.
func (ns *NS) Start(cmd *exec.Cmd) error {
	return ns.Do(cmd.Start)
}

// Dial connects to addr from inside the netns. A socket belongs to the
// netns it was made in, so only the dial runs on the switched thread;
// the connection is then used from any goroutine.
func (ns *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Close releases the namespace (it ends once no process is in it).
func (ns *NS) Close() error { return ns.f.Close() }
