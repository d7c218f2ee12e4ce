package netpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

// manyAddrs is n distinct addresses that are not the lab's, with the
// lab's B last.
func manyAddrs(n int) []string {
	allow := make([]string, 0, n)
	for i := range n - 1 {
		allow = append(allow, fmt.Sprintf("11.%d.%d.1", i/256, i%256))
	}
	return append(allow, netlab.B.String())
}

// TestPolicyAtMaxEntriesEnforced: a policy of MaxEntries addresses is
// enforced whole (one transaction in several netlink messages: in one
// message it failed at 4,096 with ENOBUFS and above with EMSGSIZE, and
// left the sandbox denying everything); one of 20,000 is refused with
// ErrInvalidPolicy before anything changes, and the policy in force
// stays in force.
func TestPolicyAtMaxEntriesEnforced(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "big")
	ctx := context.Background()
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: manyAddrs(netpolicy.MaxEntries)}); err != nil {
		t.Fatalf("SetPolicy of %d addresses: %v", netpolicy.MaxEntries, err)
	}
	wantConnect(t, sb, netlab.B)
	wantNoConnect(t, sb, netlab.A)
	got, err := m.Policy(ctx, sb.ID)
	if err != nil || len(got.Allow) != netpolicy.MaxEntries {
		t.Fatalf("Policy: %d entries, %v; want %d", len(got.Allow), err, netpolicy.MaxEntries)
	}
	for _, n := range []int{netpolicy.MaxEntries + 1, 20000} {
		err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: manyAddrs(n)})
		if !errors.Is(err, netpolicy.ErrInvalidPolicy) {
			t.Fatalf("SetPolicy of %d addresses: %v, want ErrInvalidPolicy", n, err)
		}
		if _, err := netpolicy.ParsePolicy(netpolicy.Policy{Allow: manyAddrs(n)}); !errors.Is(err, netpolicy.ErrInvalidPolicy) {
			t.Fatalf("ParsePolicy of %d addresses: %v, want ErrInvalidPolicy", n, err)
		}
		wantConnect(t, sb, netlab.B) // the old policy still holds
	}
}
