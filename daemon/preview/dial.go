package preview

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/agentrunner/runner/netpolicy"
	"golang.org/x/sys/unix"
)

// Dev servers (Vite, Next, Jupyter, python3 -m http.server --bind
// 127.0.0.1) bind to loopback. In a sandbox with its own network namespace
// that loopback is the sandbox's, which no host address reaches: no route
// leads into it, by design. So the Server does not dial the sandbox from
// the host; it makes its socket inside the sandbox's namespace (a socket
// belongs to the namespace it was created in, for its whole life) and
// connects from there, to 127.0.0.1, ::1 and then the sandbox's address.
//
// The namespace is held only while the sockets are made: a goroutine
// locked to an OS thread joins it, calls socket(2), and returns to the
// host's namespace (netpolicy.RunInNetNS, which retires the thread if it
// cannot return). The connect happens afterwards on any thread, through
// the runtime's poller, so a sandbox whose listener never accepts ties up
// no OS thread for the dial timeout, only a parked goroutine.

// dialRoute is the Transport's DialContext: it connects to the Target of
// the request being dialed for (the Transport keeps the request context's
// values for the dial), never to the address it is handed, which is only
// the pool key (see poolKey).
func dialRoute(ctx context.Context, _, _ string) (net.Conn, error) {
	rt, ok := ctx.Value(routeKey{}).(route)
	if !ok {
		return nil, errors.New("dial a sandbox port: no route in the request")
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	return dialTarget(ctx, rt.target)
}

// poolKey is the host:port under which the Transport pools connections
// to t: a digest of t's namespace and address, so two sandboxes never
// share one, and a name that resolves nowhere (.invalid), should anything
// ever try.
func poolKey(t Target) string {
	sum := sha256.Sum256([]byte(t.NetNS + "\x00" + t.Addr.String()))
	return net.JoinHostPort("s"+hex.EncodeToString(sum[:12])+".invalid", strconv.Itoa(int(t.Addr.Port())))
}

// dialTarget connects to the first of t.Addrs that does not refuse, from
// inside t's network namespace when it has one. When every address
// refuses, or is absent (no IPv6 in the namespace), the error is the
// first refusal, so errors.Is(err, syscall.ECONNREFUSED) tells "nothing
// listens" from other failures.
func dialTarget(ctx context.Context, t Target) (net.Conn, error) {
	addrs := t.Addrs()
	if t.NetNS == "" {
		d := net.Dialer{KeepAlive: 30 * time.Second}
		return firstListening(t, addrs, func(_ int, a netip.AddrPort) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", a.String())
		})
	}

	fds, err := socketsIn(t.NetNS, addrs)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	return firstListening(t, addrs, func(i int, a netip.AddrPort) (net.Conn, error) {
		fd := fds[i]
		if fd < 0 {
			return nil, nil // no such family in the namespace (IPv6 disabled)
		}
		fds[i] = -1 // connect owns it now
		return connect(ctx, fd, a)
	})
}

// firstListening calls dial for each of addrs in turn and returns the
// first connection. An address that is absent moves on to the next, and
// so does one dial skips (nil, nil); any other error ends the walk. When
// none connects, the error is notListening's.
func firstListening(t Target, addrs []netip.AddrPort, dial func(i int, a netip.AddrPort) (net.Conn, error)) (net.Conn, error) {
	var refused error
	for i, a := range addrs {
		c, err := dial(i, a)
		switch {
		case err == nil && c != nil:
			return c, nil
		case err == nil:
			continue
		case !absent(err):
			return nil, err
		}
		refused = firstRefusal(refused, err)
	}
	return nil, notListening(refused, t)
}

// absent reports whether err says nothing is there to connect to at one
// address, so the next one is worth trying.
func absent(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EADDRNOTAVAIL) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EAFNOSUPPORT)
}

func firstRefusal(prev, err error) error {
	if prev == nil || (!errors.Is(prev, syscall.ECONNREFUSED) && errors.Is(err, syscall.ECONNREFUSED)) {
		return err
	}
	return prev
}

// notListening is the error of a dial that found nothing at any address:
// a refusal when there was one.
func notListening(refused error, t Target) error {
	if refused == nil {
		refused = syscall.ECONNREFUSED // every family absent: nothing can listen
	}
	return fmt.Errorf("connect to port %d of sandbox %s: %w", t.Addr.Port(), t.Sandbox, refused)
}

// socketsIn makes one non-blocking TCP socket per address, of its family,
// inside the network namespace at nsPath. An entry is -1 where the
// namespace has no such family. The caller closes the rest.
func socketsIn(nsPath string, addrs []netip.AddrPort) ([]int, error) {
	fds := make([]int, len(addrs))
	for i := range fds {
		fds[i] = -1
	}
	err := netpolicy.RunInNetNS(nsPath, func() error {
		for i, a := range addrs {
			family := unix.AF_INET
			if a.Addr().Is6() {
				family = unix.AF_INET6
			}
			fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
			if errors.Is(err, unix.EAFNOSUPPORT) {
				continue
			}
			if err != nil {
				return fmt.Errorf("create socket: %w", os.NewSyscallError("socket", err))
			}
			fds[i] = fd
		}
		return nil
	})
	if err != nil {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		return nil, fmt.Errorf("make a socket in the sandbox's network namespace: %w", err)
	}
	return fds, nil
}

// connect connects the non-blocking socket fd, which it owns, to a and
// returns it as a net.Conn. It waits through the runtime's poller, until
// ctx is done.
func connect(ctx context.Context, fd int, a netip.AddrPort) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "preview-dial") // owns fd; pollable (non-blocking)
	defer f.Close()                              // net.FileConn holds a duplicate
	var sa unix.Sockaddr
	if a.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
	}
	switch err := unix.Connect(fd, sa); {
	case err == nil:
	case errors.Is(err, unix.EINPROGRESS), errors.Is(err, unix.EALREADY), errors.Is(err, unix.EINTR):
		if err := waitConnected(ctx, f); err != nil {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(a), Err: err}
		}
	default:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(a), Err: os.NewSyscallError("connect", err)}
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("wrap socket: %w", err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAlive(true)
		_ = tc.SetKeepAlivePeriod(30 * time.Second)
	}
	return c, nil
}

// waitConnected waits until the connect in progress on f ends, the way
// the net package does: writable, then SO_ERROR, then getpeername (the
// poller may wake spuriously).
func waitConnected(ctx context.Context, f *os.File) error {
	if d, ok := ctx.Deadline(); ok {
		if err := f.SetWriteDeadline(d); err != nil {
			return fmt.Errorf("set connect deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var result error
	werr := rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			result = os.NewSyscallError("getsockopt", err)
			return true
		}
		switch e := syscall.Errno(v); e {
		case syscall.EINPROGRESS, syscall.EALREADY, syscall.EINTR:
			return false
		case syscall.EISCONN:
			return true
		case 0:
			_, err := unix.Getpeername(int(fd))
			return err == nil // not yet connected: wait again
		default:
			result = os.NewSyscallError("connect", e)
			return true
		}
	})
	if werr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return werr
	}
	return result
}
