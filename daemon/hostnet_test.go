package daemon_test

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// hostNetSnapshot describes the real host's network configuration that
// runnerd's containment could change: links, nftables tables and
// ip_forward. TestMain fails the run if a test changed it (every test
// must use a namespace of its own). Empty when not root.
func hostNetSnapshot() (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	var parts []string
	links, err := netlink.LinkList()
	if err != nil {
		return "", fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		parts = append(parts, "link "+l.Attrs().Name)
	}
	c, err := nftables.New()
	if err != nil {
		return "", fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return "", fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		parts = append(parts, fmt.Sprintf("table %d %s", t.Family, t.Name))
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return "", err
	}
	parts = append(parts, "ip_forward "+strings.TrimSpace(string(fwd)))
	slices.Sort(parts)
	return strings.Join(parts, "\n"), nil
}
