package daemon

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/agentrunner/runner/daemon/preview"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestListeningInNetNS: a listener is found in the network namespace it
// was opened in, on a wildcard or an address the preview proxy connects
// to (127.0.0.1, ::1, the sandbox's address), and nowhere else (not in
// runnerd's own namespace, not on another port or address).
func TestListeningInNetNS(t *testing.T) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.New() // and this thread is in it
	if err != nil {
		runtime.UnlockOSThread()
		t.Skipf("cannot create a network namespace (needs root): %v", err)
	}
	var wild, exact, other net.Listener
	func() {
		defer func() {
			if err := netns.Set(orig); err != nil {
				t.Fatalf("restore netns: %v", err) // the thread stays locked and dies
			}
			runtime.UnlockOSThread()
		}()
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			t.Fatalf("lo up: %v", err)
		}
		if wild, err = net.Listen("tcp", "0.0.0.0:0"); err != nil {
			t.Fatal(err)
		}
		if exact, err = net.Listen("tcp6", "[::1]:0"); err != nil {
			t.Fatal(err)
		}
		// 127.0.0.2 is loopback too, but the proxy does not dial it.
		if other, err = net.Listen("tcp4", "127.0.0.2:0"); err != nil {
			t.Fatal(err)
		}
	}()
	defer orig.Close()
	defer ns.Close()
	defer wild.Close()
	defer exact.Close()
	defer other.Close()
	path := fmt.Sprintf("/proc/self/fd/%d", int(ns))
	wildPort := wild.Addr().(*net.TCPAddr).Port
	exactPort := exact.Addr().(*net.TCPAddr).Port
	otherPort := other.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name   string
		ns     string
		addr   string
		port   int
		listen bool
	}{
		{"wildcard in its namespace", path, "10.213.0.2", wildPort, true},
		{"wildcard, loopback", path, "127.0.0.1", wildPort, true},
		{"::1, for a sandbox with an address", path, "10.213.0.2", exactPort, true},
		{"::1, for a sandbox on loopback", path, "127.0.0.1", exactPort, true},
		{"an address the proxy does not dial", path, "10.213.0.2", otherPort, false},
		{"another port", path, "10.213.0.2", wildPort + 1, false},
	} {
		got, err := listening(preview.Target{NetNS: tc.ns, Addr: netip.AddrPortFrom(netip.MustParseAddr(tc.addr), uint16(tc.port))})
		if err != nil || got != tc.listen {
			t.Errorf("%s: got %v, %v; want %v", tc.name, got, err, tc.listen)
		}
	}
	// Not in runnerd's own namespace (unless something there holds the
	// port by chance: check with a bind).
	if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", wildPort)); err == nil {
		l.Close()
		if got, err := listening(preview.Target{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(wildPort))}); err != nil || got {
			t.Errorf("host namespace: got %v, %v; want false", got, err)
		}
	}
}
