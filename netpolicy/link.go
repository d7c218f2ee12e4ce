package netpolicy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sandboxIf is the name of the veth end inside a sandbox.
const sandboxIf = "eth0"

// slotAddrs returns the gateway (host side) and sandbox addresses of the
// /30 at index slot of the pool.
func slotAddrs(pool netip.Prefix, slot int) (netw netip.Prefix, gw, addr netip.Addr) {
	base := pool.Masked().Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(slot) * 4
	n := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return netip.PrefixFrom(n, 30), n.Next(), n.Next().Next()
}

func poolSlots(pool netip.Prefix) int {
	if pool.Bits() > 30 {
		return 0
	}
	return 1 << (30 - pool.Bits())
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// linkSlots bounds the link work (namespaces, veths, addresses, routes)
// in progress at once: each step blocks an OS thread in the kernel, and
// the kernel runs them one at a time under its RTNL lock anyway, so a
// hundred parallel creates would hold a hundred threads for nothing.
const linkSlots = 4

// linkSlot takes a slot of the link work; the caller runs the release.
func (m *Manager) linkSlot() (release func()) {
	m.links <- struct{}{}
	return func() { <-m.links }
}

// ensureLinks converges the sandbox's netns, veth pair, addresses and
// routes to the wanted state, creating what is missing.
func (m *Manager) ensureLinks(n sbNames, nsPath string, gw, addr netip.Addr) error {
	defer m.linkSlot()()
	fresh := false
	if !isNetNSMount(nsPath) {
		if err := createNetNS(nsPath); err != nil {
			return err
		}
		fresh = true
	}
	sbNS, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer sbNS.Close()
	sbH, err := netlink.NewHandleAt(sbNS)
	if err != nil {
		return fmt.Errorf("open netlink in sandbox netns: %w", err)
	}
	defer sbH.Close()

	hostLink, err := m.hostH.LinkByName(n.hostIf)
	if err == nil {
		// Re-adopt only a veth whose peer is still in this netns; a veth
		// left over from a lost netns is replaced.
		_, perr := sbH.LinkByName(sandboxIf)
		if _, isVeth := hostLink.(*netlink.Veth); fresh || perr != nil || !isVeth {
			if err := m.hostH.LinkDel(hostLink); err != nil {
				return fmt.Errorf("delete stale veth %s: %w", n.hostIf, err)
			}
			hostLink = nil
		}
	} else if !isLinkNotFound(err) {
		return fmt.Errorf("find veth %s: %w", n.hostIf, err)
	} else {
		hostLink = nil
	}
	if hostLink == nil {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: n.hostIf},
			PeerName:      sandboxIf,
			PeerNamespace: netlink.NsFd(int(sbNS)),
		}
		if err := m.hostH.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", n.hostIf, err)
		}
		if hostLink, err = m.hostH.LinkByName(n.hostIf); err != nil {
			return fmt.Errorf("find veth %s: %w", n.hostIf, err)
		}
	}
	if err := replaceOnlyAddr(m.hostH, hostLink, gw); err != nil {
		return fmt.Errorf("address veth %s: %w", n.hostIf, err)
	}
	if err := m.hostH.LinkSetUp(hostLink); err != nil {
		return fmt.Errorf("bring up veth %s: %w", n.hostIf, err)
	}

	lo, err := sbH.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find sandbox lo: %w", err)
	}
	if err := sbH.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring up sandbox lo: %w", err)
	}
	eth, err := sbH.LinkByName(sandboxIf)
	if err != nil {
		return fmt.Errorf("find sandbox %s: %w", sandboxIf, err)
	}
	if err := replaceOnlyAddr(sbH, eth, addr); err != nil {
		return fmt.Errorf("address sandbox %s: %w", sandboxIf, err)
	}
	if err := sbH.LinkSetUp(eth); err != nil {
		return fmt.Errorf("bring up sandbox %s: %w", sandboxIf, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice(), Dst: ipNet(netip.IPv4Unspecified(), 0)}
	if err := sbH.RouteReplace(route); err != nil {
		return fmt.Errorf("add sandbox default route: %w", err)
	}
	return enablePing(sbNS)
}

// pingGroupRange lets every group open ICMP echo sockets (SOCK_DGRAM,
// IPPROTO_ICMP): ping without CAP_NET_RAW, which a sandbox's commands
// never hold. A new network namespace starts at "1 0" (nobody). The
// socket can send echo requests only (the kernel builds the header), so
// it opens nothing the sandbox's rules do not already judge.
const pingGroupRange = "0\t2147483647"

// enablePing sets net.ipv4.ping_group_range in ns (a per-namespace sysctl:
// /proc/sys/net is the namespace of the thread that opens it).
func enablePing(ns netns.NsHandle) error {
	return inNetNS(ns, func() error {
		const p = "/proc/sys/net/ipv4/ping_group_range"
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == pingGroupRange {
			return nil
		}
		if err := os.WriteFile(p, []byte(pingGroupRange+"\n"), 0o644); err != nil {
			return fmt.Errorf("set sandbox ping_group_range: %w", err)
		}
		return nil
	})
}

// replaceOnlyAddr makes a the link's only IPv4 address (in a /30).
func replaceOnlyAddr(h *netlink.Handle, l netlink.Link, a netip.Addr) error {
	have, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	want := ipNet(a, 30)
	for _, x := range have {
		if x.IPNet.String() != want.String() {
			if err := h.AddrDel(l, &x); err != nil {
				return err
			}
		}
	}
	return h.AddrReplace(l, &netlink.Addr{IPNet: want})
}

// removeLinks removes the netns file and the veth pair. Absent is
// success.
//
// The namespace goes first: once no process or socket holds it, the
// kernel destroys it, and its veth pair with it, in a batch with every
// namespace released meanwhile (one round of RCU grace periods for the
// batch), where deleting each veth costs its own rounds under the RTNL
// lock: 100 teardowns at once took 3.2 s one veth at a time, 0.25 s this
// way. removeLinks waits (bounded) for the host end to go; if it stays
// (something still holds the namespace), it deletes it. Meanwhile the
// sandbox's rules still judge its traffic: they go after the link.
func (m *Manager) removeLinks(n sbNames, nsPath string) error {
	nsErr := removeNetNS(nsPath)
	if nsErr == nil {
		if gone, err := m.waitLinkGone(n.hostIf, linkGoneWait); err == nil && gone {
			return nil
		}
	}
	defer m.linkSlot()()
	l, err := m.hostH.LinkByName(n.hostIf)
	switch {
	case isLinkNotFound(err):
		err = nil
	case err != nil:
		err = fmt.Errorf("find veth %s: %w", n.hostIf, err)
	default:
		if err = m.hostH.LinkDel(l); err != nil && !isLinkNotFound(err) {
			err = fmt.Errorf("delete veth %s: %w", n.hostIf, err)
		} else {
			err = nil
		}
	}
	return errors.Join(nsErr, err)
}

// linkGoneWait bounds removeLinks' wait for the kernel to destroy a
// released namespace's veth.
const linkGoneWait = 2 * time.Second

// waitLinkGone polls, backing off from 1 to 32 ms, until the host has no
// link named ifName (true) or d has passed (false).
func (m *Manager) waitLinkGone(ifName string, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for step := time.Millisecond; ; step = min(2*step, 32*time.Millisecond) {
		_, err := m.hostH.LinkByName(ifName)
		if isLinkNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("find veth %s: %w", ifName, err)
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		time.Sleep(step)
	}
}

func isLinkNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, unix.ENODEV)
}

// enableForwarding turns on IPv4 forwarding in the host namespace if it
// is off. This is the one piece of global host state the package changes
// outside its own table; it is never turned back off, because other
// software may have come to rely on it.
func (m *Manager) enableForwarding() error {
	return inNetNS(m.hostNS, func() error {
		const p = "/proc/sys/net/ipv4/ip_forward"
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read ip_forward: %w", err)
		}
		if len(b) > 0 && b[0] == '1' {
			return nil
		}
		if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("enable ip_forward: %w", err)
		}
		return nil
	})
}
