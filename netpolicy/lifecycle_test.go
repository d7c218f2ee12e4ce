package netpolicy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/netpolicy/netlab"
)

func TestRawIPAndCIDREntries(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "raw-ip")
	ctx := context.Background()

	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{netlab.B.String()}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	wantConnect(t, sb, netlab.B)
	wantNoConnect(t, sb, netlab.A)
	wantRefused(t, sb, "allowed.test")

	// A CIDR admits everything inside it, nothing outside it.
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{"10.99.0.2/31", "10.99.0.3"}}); err != nil {
		t.Fatalf("SetPolicy(cidr): %v", err)
	}
	wantConnect(t, sb, netlab.A)
	wantConnect(t, sb, netlab.B)
	wantNoDNS(t, sb, netlab.C)

	// A wildcard admits names below it, not the apex.
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{"*.wild.test"}}); err != nil {
		t.Fatalf("SetPolicy(wildcard): %v", err)
	}
	wantNoConnect(t, sb, netlab.A) // narrowing revoked the CIDR
	wantRefused(t, sb, "wild.test")
	wantResolves(t, sb, "sub.wild.test", netlab.A)
	wantConnect(t, sb, netlab.A)
	wantNoConnect(t, sb, netlab.B)

	got, err := m.Policy(ctx, sb.ID)
	if err != nil || !slices.Equal(got.Allow, []string{"*.wild.test"}) {
		t.Fatalf("Policy: got %v, %v; want [*.wild.test]", got, err)
	}
	// An invalid policy changes nothing.
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{"allowed.test:443"}}); !errors.Is(err, netpolicy.ErrInvalidPolicy) {
		t.Fatalf("SetPolicy(host:port): got %v, want ErrInvalidPolicy", err)
	}
	wantConnect(t, sb, netlab.A)
}

// kernelState summarizes what the package holds in the host namespace.
type kernelState struct {
	chains   []string // "name:rules"
	sets     []string
	dispatch int // elements of the dispatch verdict maps
	links    []string
}

func snapshot(t *testing.T, l *lab, m *netpolicy.Manager) kernelState {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(l.Host)))
	if err != nil {
		t.Fatal(err)
	}
	var ks kernelState
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name != m.TableName() {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		ks.chains = append(ks.chains, fmt.Sprintf("%s:%d", ch.Name, len(rules)))
	}
	sets, err := c.GetSets(&nftables.Table{Name: m.TableName(), Family: nftables.TableFamilyINet})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		ks.sets = append(ks.sets, s.Name)
		if strings.HasPrefix(s.Name, "sandbox-") {
			elems, err := c.GetSetElements(s)
			if err != nil {
				t.Fatal(err)
			}
			ks.dispatch += len(elems)
		}
	}
	for _, li := range l.HostLinks(t) {
		// The index changes if a link is re-created: re-adoption must not.
		ks.links = append(ks.links, fmt.Sprintf("%s#%d", li.Attrs().Name, li.Attrs().Index))
	}
	slices.Sort(ks.chains)
	slices.Sort(ks.sets)
	slices.Sort(ks.links)
	return ks
}

func equalState(a, b kernelState) bool {
	return slices.Equal(a.chains, b.chains) && slices.Equal(a.sets, b.sets) && a.dispatch == b.dispatch && slices.Equal(a.links, b.links)
}

func TestSetupIdempotentAndTeardownRemovesEverything(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	ctx := context.Background()
	before := snapshot(t, l, m)

	sb1, err := m.Setup(ctx, "idem")
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if err := m.SetPolicy(ctx, "idem", netpolicy.Policy{Allow: []string{"allowed.test", netlab.B.String()}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	once := snapshot(t, l, m)
	sb2, err := m.Setup(ctx, "idem")
	if err != nil {
		t.Fatalf("Setup again: %v", err)
	}
	if *sb1 != *sb2 {
		t.Fatalf("Setup again: got %+v, want %+v", sb2, sb1)
	}
	if twice := snapshot(t, l, m); !equalState(once, twice) {
		t.Fatalf("Setup again changed kernel state:\n got %+v\nwant %+v", twice, once)
	}
	// One element in each dispatch map (forward egress, input).
	if once.dispatch != 2 {
		t.Fatalf("dispatch elements: got %d, want 2", once.dispatch)
	}
	// Setup again keeps the policy.
	wantConnect(t, sb2, netlab.B)
	wantResolves(t, sb2, "allowed.test", netlab.A)
	wantConnect(t, sb2, netlab.A)

	// A second sandbox gets its own /30 and is isolated from the first.
	other := setup(t, m, "idem-2")
	if other.Addr == sb1.Addr || other.Gateway == sb1.Gateway {
		t.Fatalf("second sandbox shares addresses: %+v vs %+v", other, sb1)
	}
	if _, err := sbGet(t, other, sb1.Addr); err == nil {
		t.Fatalf("sandbox reached another sandbox")
	}

	if err := m.Teardown(ctx, "idem"); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if err := m.Teardown(ctx, "idem"); err != nil {
		t.Fatalf("Teardown again: got %v, want nil (absent is success)", err)
	}
	if err := m.Teardown(ctx, "idem-2"); err != nil {
		t.Fatalf("Teardown second: %v", err)
	}
	if after := snapshot(t, l, m); !equalState(before, after) {
		t.Fatalf("Teardown left state behind:\n got %+v\nwant %+v", after, before)
	}
	for _, p := range []string{sb1.NetNSPath, sb1.ResolvConfPath, m.RecordPath("idem")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Teardown left %s: %v", p, err)
		}
	}
	if _, err := m.Policy(ctx, "idem"); !errors.Is(err, netpolicy.ErrUnknownSandbox) {
		t.Fatalf("Policy after Teardown: got %v, want ErrUnknownSandbox", err)
	}
	if err := m.SetPolicy(ctx, "idem", netpolicy.Policy{}); !errors.Is(err, netpolicy.ErrUnknownSandbox) {
		t.Fatalf("SetPolicy after Teardown: got %v, want ErrUnknownSandbox", err)
	}
}

func TestReadoptAfterRestart(t *testing.T) {
	l := newLab(t)
	ctx := context.Background()
	m1 := newManager(t, l)
	sb1, err := m1.Setup(ctx, "survivor")
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if err := m1.SetPolicy(ctx, sb1.ID, netpolicy.Policy{Allow: []string{"allowed.test"}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	wantResolves(t, sb1, "allowed.test", netlab.A)
	wantConnect(t, sb1, netlab.A)
	state := snapshot(t, l, m1)
	if err := m1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := m1.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
	if _, err := m1.Setup(ctx, "survivor"); !errors.Is(err, netpolicy.ErrClosed) {
		t.Fatalf("Setup after Close: got %v, want ErrClosed", err)
	}
	// The daemon is down: the sandbox keeps its rules (still contained).
	wantNoConnect(t, sb1, netlab.B)
	if _, _, err := resolveA(t, sb1, "allowed.test"); err == nil {
		t.Fatalf("resolver answered after Close")
	}

	m2 := newManager(t, l)
	if got := snapshot(t, l, m2); !equalState(state, got) {
		t.Fatalf("New changed kernel state:\n got %+v\nwant %+v", got, state)
	}
	sb2 := setup(t, m2, "survivor")
	if *sb2 != *sb1 {
		t.Fatalf("re-adopted sandbox: got %+v, want %+v", sb2, sb1)
	}
	if got := snapshot(t, l, m2); !equalState(state, got) {
		t.Fatalf("re-adoption duplicated state:\n got %+v\nwant %+v", got, state)
	}
	p, err := m2.Policy(ctx, "survivor")
	if err != nil || !slices.Equal(p.Allow, []string{"allowed.test"}) {
		t.Fatalf("Policy after re-adoption: got %v, %v; want [allowed.test]", p, err)
	}
	wantResolves(t, sb2, "allowed.test", netlab.A)
	wantConnect(t, sb2, netlab.A)
	wantNoConnect(t, sb2, netlab.B)
	wantRefused(t, sb2, "other.test")
}

func TestSetPolicyFailsClosed(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "fail-closed")
	ctx := context.Background()
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{"allowed.test", netlab.B.String()}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	wantResolves(t, sb, "allowed.test", netlab.A)
	wantConnect(t, sb, netlab.A)

	boom := errors.New("injected kernel failure")
	m.FailSetPolicy(boom)
	if err := m.SetPolicy(ctx, sb.ID, netpolicy.Policy{Allow: []string{"allowed.test", netlab.B.String(), "other.test"}}); !errors.Is(err, boom) {
		t.Fatalf("SetPolicy with failure: got %v, want %v", err, boom)
	}
	m.FailSetPolicy(nil)
	// Everything is shut, including what the old policy allowed, and the
	// reported policy says so.
	wantNoConnect(t, sb, netlab.A)
	wantNoConnect(t, sb, netlab.B)
	wantRefused(t, sb, "allowed.test")
	wantRefused(t, sb, "other.test")
	if p, err := m.Policy(ctx, sb.ID); err != nil || len(p.Allow) != 0 {
		t.Fatalf("Policy after failure: got %v, %v; want empty", p, err)
	}
}

func TestRunInNetNS(t *testing.T) {
	l := newLab(t)
	m := newManager(t, l)
	sb := setup(t, m, "spawn")
	cmd := exec.Command("/bin/sleep", "30")
	if err := netpolicy.RunInNetNS(sb.NetNSPath, cmd.Start); err != nil {
		t.Fatalf("start in netns: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	in, err := netpolicy.ProcessInNetNS(cmd.Process.Pid, sb.NetNSPath)
	if err != nil || !in {
		t.Fatalf("netpolicy.ProcessInNetNS(child): got %v, %v; want true", in, err)
	}
	in, err = netpolicy.ProcessInNetNS(os.Getpid(), sb.NetNSPath)
	if err != nil || in {
		t.Fatalf("netpolicy.ProcessInNetNS(self): got %v, %v; want false", in, err)
	}
}

// TestNewRemovesStale: kernel objects of a sandbox without a record (its
// Teardown stopped after the link went) are removed by the next New; a
// sandbox with a record keeps its objects until Setup re-adopts it.
func TestNewRemovesStale(t *testing.T) {
	l := newLab(t)
	ctx := context.Background()
	m1 := newManager(t, l)
	before := snapshot(t, l, m1)
	kept, err := m1.Setup(ctx, "kept")
	if err != nil {
		t.Fatalf("Setup(kept): %v", err)
	}
	t.Cleanup(func() { netlab.UnmountLeftovers(l.cfg.StateDir) })
	if _, err := m1.Setup(ctx, "stale"); err != nil {
		t.Fatalf("Setup(stale): %v", err)
	}
	withKept := snapshot(t, l, m1)
	if withKept.dispatch != 4 {
		t.Fatalf("dispatch elements with two sandboxes: got %d, want 4", withKept.dispatch)
	}
	m1.Close()
	if err := os.Remove(m1.RecordPath("stale")); err != nil {
		t.Fatal(err)
	}
	// An earlier version's per-sandbox chain towards a sandbox goes too.
	c, err := nftables.New(nftables.WithNetNSFd(int(l.Host)))
	if err != nil {
		t.Fatal(err)
	}
	c.AddChain(&nftables.Chain{Name: "in-kept", Table: &nftables.Table{Name: m1.TableName(), Family: nftables.TableFamilyINet}})
	if err := c.Flush(); err != nil {
		t.Fatalf("add legacy chain: %v", err)
	}
	m2 := newManager(t, l)
	got := snapshot(t, l, m2)
	if got.dispatch != 2 || slices.Contains(got.sets, "allow-stale") || slices.Contains(got.sets, "dns-stale") ||
		slices.ContainsFunc(got.chains, func(c string) bool {
			name := strings.Split(c, ":")[0]
			return strings.HasSuffix(name, "-stale") || strings.HasPrefix(name, "in-")
		}) {
		t.Fatalf("New left the stale sandbox's objects: %+v", got)
	}
	if !slices.Contains(got.sets, "allow-kept") {
		t.Fatalf("New removed the recorded sandbox's objects: %+v", got)
	}
	sb := setup(t, m2, "kept")
	if *sb != *kept {
		t.Fatalf("re-adopted: got %+v, want %+v", sb, kept)
	}
	wantNoConnect(t, sb, netlab.A)
	if err := m2.Teardown(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	if err := m2.Teardown(ctx, "stale"); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, l, m2); !equalState(before, after) {
		t.Fatalf("state after teardown:\n got %+v\nwant %+v", after, before)
	}
}
