package daemon

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestListeningInNetNS: a listener is found in the network namespace it
// was opened in, on a wildcard or the exact address, and nowhere else (not
// in runnerd's own namespace, not on another port or address).
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
	var wild, exact net.Listener
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
	}()
	defer orig.Close()
	defer ns.Close()
	defer wild.Close()
	defer exact.Close()
	path := fmt.Sprintf("/proc/self/fd/%d", int(ns))
	wildPort := wild.Addr().(*net.TCPAddr).Port
	exactPort := exact.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		name   string
		ns     string
		addr   string
		port   int
		listen bool
	}{
		{"wildcard in its namespace", path, "10.213.0.2", wildPort, true},
		{"wildcard, loopback", path, "127.0.0.1", wildPort, true},
		{"exact address", path, "::1", exactPort, true},
		{"another address", path, "10.213.0.2", exactPort, false},
		{"another port", path, "10.213.0.2", wildPort + 1, false},
	} {
		got, err := listening(tc.ns, netip.MustParseAddr(tc.addr), tc.port)
		if err != nil || got != tc.listen {
			t.Errorf("%s: got %v, %v; want %v", tc.name, got, err, tc.listen)
		}
	}
	// Not in runnerd's own namespace (unless something there holds the
	// port by chance: check with a bind).
	if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", wildPort)); err == nil {
		l.Close()
		if got, err := listening("", netip.MustParseAddr("127.0.0.1"), wildPort); err != nil || got {
			t.Errorf("host namespace: got %v, %v; want false", got, err)
		}
	}
}
