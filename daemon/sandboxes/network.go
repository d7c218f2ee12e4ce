package sandboxes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentrunner/runner/daemon/apierr"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/wire"
)

// Network containment (package netpolicy) as runnerd uses it:
//
//   - A sandbox's registry record is the truth about its network: Network
//     nil means the host network (the machine is the user's); non-nil
//     means its own namespace with that allowlist. The record is written
//     before the kernel is touched, so a failure in between leaves a
//     sandbox that is contained more than asked (netpolicy fails closed,
//     and a spawn into a namespace that is not set up is refused), never
//     less.
//   - A command of a contained sandbox starts inside the namespace (the
//     shim setns(2)s before it forks the command) and runnerd checks that
//     it did, killing it otherwise: never a contained command uncontained.
//   - A policy is never applied under running processes that would escape
//     it: switching a sandbox from the host network to a namespace is
//     refused while any of its sessions runs, or keeps processes that
//     outlived its command.

// ErrNoNetPolicy is the answer to any policy request on a host that does
// not enforce policies.
func ErrNoNetPolicy() *apierr.Error {
	return apierr.NotSupported("network policy is not enforced on this host (network_policy is not advertised; see runnerd's startup log)")
}

// NetID is the netpolicy id of a sandbox incarnation: a DNS label of at
// most 63 bytes, different for every incarnation, so a re-created sandbox
// never inherits its predecessor's namespace, address or rules.
func NetID(name, incarnation string) string {
	const maxName = 63 - 1 - 16 // "-" and a 16-hex-digit incarnation
	if len(name) > maxName {
		name = strings.TrimRight(name[:maxName], "-")
	}
	return name + "-" + incarnation
}

// StartNetPolicy enables network containment when the configuration asks
// for it and the host can enforce it, then starts the re-adoption of every
// sandbox the registry says has a network, in the background: runnerd
// serves at once whatever the number of sandboxes (their rules, which
// outlive runnerd, keep enforcing meanwhile; their DNS resolvers are back
// once adopted), and a call that needs a sandbox's network adopts that
// one first (NetFor). It never fails Run: a host that cannot enforce runs
// without the capability, and says why in the log. The returned stop ends
// the re-adoption and waits for it.
func (s *Manager) StartNetPolicy(ctx context.Context) (stop func()) {
	if !s.cfg.NetPolicy {
		s.log.Info("network policy disabled (--netpolicy=off): network_policy is not advertised and policies are refused")
		return func() {}
	}
	state := s.cfg.NetPolicyState
	m, err := netpolicy.New(ctx, netpolicy.Config{
		StateDir:  state,
		Table:     s.cfg.NetTable,
		Pool:      s.cfg.NetPolicyPool,
		Upstream:  s.cfg.DNSUpstream,
		HostNetNS: s.cfg.NetPolicyHostNetNS,
	})
	if err != nil {
		why := "the host cannot enforce it"
		if !errors.Is(err, netpolicy.ErrUnsupported) {
			why = "setting it up failed"
		}
		s.log.Warn("network policy not enforced: "+why+"; network_policy is not advertised and policies are refused with not_supported", "err", err)
		s.warnUncontainable() // logs every sandbox that cannot be contained now
		return func() {}
	}
	s.net = m
	pool := s.cfg.NetPolicyPool // the start line said pool="" for the default
	if !pool.IsValid() {
		pool = netpolicy.DefaultPool
	}
	s.log.Info("network policy enforced", "state", state, "table", s.cfg.NetTable, "pool", pool, "host_netns", s.cfg.NetPolicyHostNetNS,
		"egress_private", s.cfg.EgressPrivate)
	names, err := s.containedSandboxes()
	if err != nil {
		s.log.Error("re-adopt sandbox networks: read registry; each is adopted when a call needs it", "err", err)
		return func() {}
	}
	s.netPending.Store(int64(len(names)))
	actx, cancel := context.WithCancel(s.life)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.adoptNets(actx, names)
	}()
	return func() { cancel(); <-done }
}

// containedSandboxes lists the sandboxes whose record has a network.
func (s *Manager) containedSandboxes() ([]string, error) {
	var names []string
	err := s.Each(context.Background(), func(sb registry.Sandbox) {
		if sb.Network != nil {
			names = append(names, sb.Name)
		}
	})
	return names, err
}

// warnUncontainable logs each sandbox with a network a runnerd that does
// not enforce policies cannot contain.
func (s *Manager) warnUncontainable() {
	names, err := s.containedSandboxes()
	if err != nil {
		s.log.Error("read registry", "err", err)
		return
	}
	for _, name := range names {
		s.log.Error("sandbox has a network policy this runnerd cannot enforce: its commands are refused until runnerd runs where it can", "sandbox", name)
	}
}

// adoptWorkers is how many sandboxes the background re-adoption sets up
// at once: their nftables changes meet in netpolicy's rule writer and
// are committed together, so more workers mean bigger transactions, up
// to the writer's batch.
const adoptWorkers = 32

// adoptNets converges the namespaces, rules and resolvers of a previous
// runnerd (or a previous boot) to the registry for the sandboxes named,
// adoptWorkers at a time, each under its sandbox's lock. A sandbox a call
// adopted first, destroyed or re-created meanwhile is skipped; one that
// fails stays refused for spawns (which retry its setup) and is logged.
func (s *Manager) adoptNets(ctx context.Context, names []string) {
	t0 := time.Now()
	work := make(chan string)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range min(adoptWorkers, len(names)) {
		wg.Go(func() {
			for name := range work {
				if !s.adoptNet(ctx, name) {
					failed.Add(1)
				}
				s.netPending.Add(-1)
			}
		})
	}
	sent := 0
feed:
	for _, name := range names {
		select {
		case work <- name:
			sent++
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	s.netPending.Add(-int64(len(names) - sent))
	if sent == len(names) {
		s.log.Info("sandbox networks re-adopted", "sandboxes", len(names), "failed", failed.Load(), "took", time.Since(t0).Round(time.Millisecond))
	}
}

// adoptNet re-adopts one sandbox's network under its lock; false when it
// failed.
func (s *Manager) adoptNet(ctx context.Context, name string) bool {
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.reg.GetSandbox(name)
	if err != nil || sb.Network == nil {
		return true // destroyed, or moved to the host network, meanwhile
	}
	id := NetID(sb.Name, sb.Incarnation)
	s.netMu.Lock()
	done := s.nets[id] != nil
	s.netMu.Unlock()
	if done {
		return true // a call adopted it first
	}
	if _, err := s.ensureNet(ctx, sb); err != nil {
		if ctx.Err() == nil {
			s.log.Error("re-adopt sandbox network; its commands are refused until it is set up", "sandbox", sb.Name, "err", err)
		}
		return false
	}
	s.log.Debug("sandbox network re-adopted", "sandbox", sb.Name, "allow", sb.Network.Allow)
	return true
}

// CollectNetStats sends the counters of the sandboxes' DNS resolvers and
// of netpolicy's admission writer (what a sandbox flooding its resolver
// was refused), when policies are enforced.
func (s *Manager) CollectNetStats(ch chan<- prometheus.Metric) {
	if s.net == nil {
		return
	}
	st := s.net.Stats()
	counter := func(name, help string, v uint64) {
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, float64(v))
	}
	const dropped = "runnerd_dns_queries_dropped_total"
	dropHelp := fmt.Sprintf("DNS queries of sandboxes dropped unanswered by their resolver: over its rate (%d/s, burst %d; a TCP connection counts once) or with %d already in progress (busy).",
		netpolicy.ResolverRate, netpolicy.ResolverBurst, netpolicy.ResolverInflight)
	desc := prometheus.NewDesc(dropped, dropHelp, []string{"reason"}, nil)
	ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(st.QueriesRateLimited), "rate")
	ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(st.QueriesBusy), "busy")
	counter("runnerd_dns_tcp_conns_refused_total", fmt.Sprintf("TCP connections to a sandbox's resolver closed at accept: it held %d already.", netpolicy.ResolverTCPConns), st.TCPConnsRefused)
	counter("runnerd_dns_addresses_not_admitted_total", fmt.Sprintf("Answered addresses not admitted into a sandbox's dynamic set because it held %d (the answer was served).", netpolicy.MaxAdmitted), st.AddressesOverCap)
	counter("runnerd_dns_admission_queue_full_total", "DNS answers refused (SERVFAIL) because the admission writer's queue was full.", st.AdmissionsQueueFull)
	counter("runnerd_dns_addresses_admitted_total", "Addresses the admission writer added to (or refreshed in) sandboxes' dynamic sets.", st.AddressesAdmitted)
	counter("runnerd_dns_admission_commits_total", "nftables transactions of the admission writer.", st.AdmissionCommits)
	counter("runnerd_netpolicy_rule_commits_total", "nftables transactions of the rule writer (every change of runnerd's table: sandboxes' rules, policies, admissions).", st.RuleCommits)
	counter("runnerd_netpolicy_rule_changes_total", "Changes the rule writer committed (a transaction carries those queued together).", st.RuleChanges)
	counter("runnerd_netpolicy_rule_batches_retried_total", "Rule writer transactions that failed as a whole and were committed again change by change.", st.RuleBatchesRetried)
}

// ensureNet makes the kernel match sb's record: its namespace exists and
// enforces sb.Network. Idempotent. The caller holds sb's lock (or runs
// before serving). A failure leaves the sandbox denying everything.
func (s *Manager) ensureNet(ctx context.Context, sb registry.Sandbox) (*netpolicy.Sandbox, error) {
	if s.net == nil {
		return nil, ErrNoNetPolicy()
	}
	id := NetID(sb.Name, sb.Incarnation)
	s.netMu.Lock()
	nsb := s.nets[id]
	s.netMu.Unlock()
	if nsb == nil {
		var err error
		if nsb, err = s.net.Setup(ctx, id); err != nil {
			return nil, apierr.Unavailable("set up network of sandbox %q: %v", sb.Name, err)
		}
	}
	if err := s.net.SetPolicy(ctx, id, netpolicy.Policy{Allow: sb.Network.Allow}); err != nil {
		if errors.Is(err, netpolicy.ErrInvalidPolicy) {
			// Only a record written by another version could hold one.
			return nil, apierr.Invalid("network policy of sandbox %q: %v", sb.Name, err)
		}
		// What holds afterwards is the caller's to say: an update puts
		// the old policy back where it can (restorePolicy), a create
		// removes the sandbox.
		return nil, apierr.Unavailable("apply network policy of sandbox %q: %v", sb.Name, err)
	}
	s.netMu.Lock()
	s.nets[id] = nsb
	s.netMu.Unlock()
	return nsb, nil
}

// NetFor returns the namespace a command of sb must run in: nil for a
// sandbox on the host network. It sets the namespace up if this runnerd
// has not yet (a failed re-adoption); it never returns nil for a
// contained sandbox.
func (s *Manager) NetFor(ctx context.Context, sb registry.Sandbox) (*netpolicy.Sandbox, error) {
	if sb.Network == nil {
		return nil, nil
	}
	if s.net == nil {
		return nil, ErrNoNetPolicy()
	}
	s.netMu.Lock()
	nsb := s.nets[NetID(sb.Name, sb.Incarnation)]
	s.netMu.Unlock()
	if nsb != nil {
		return nsb, nil
	}
	// Not adopted yet (runnerd just started, and the background
	// re-adoption has not reached it) or a failed one: this sandbox
	// alone, now, bounded.
	actx, cancel := context.WithTimeout(ctx, netAdoptWait)
	defer cancel()
	nsb, err := s.ensureNet(actx, sb)
	if err != nil && actx.Err() != nil && ctx.Err() == nil {
		ae := apierr.Unavailable("the network of sandbox %q is not set up yet (runnerd is re-adopting its sandboxes' networks after its start): try again", sb.Name)
		ae.RetryAfterMS = netAdoptRetryMS
		return nil, ae
	}
	return nsb, err
}

// netAdoptWait bounds how long a call waits for its sandbox's network to
// be set up; past it the answer is 503 with retry_after_ms
// netAdoptRetryMS.
const (
	netAdoptWait    = 10 * time.Second
	netAdoptRetryMS = 1000
)

// teardownNet removes sb's namespace, veth, rules and resolver. The
// caller has stopped its sessions.
func (s *Manager) teardownNet(ctx context.Context, sb registry.Sandbox) error {
	if sb.Network == nil {
		return nil
	}
	if s.net == nil {
		s.log.Warn("destroying a sandbox whose network this runnerd cannot tear down; its namespace (denying all) stays until a runnerd that enforces policies starts", "sandbox", sb.Name)
		return nil
	}
	id := NetID(sb.Name, sb.Incarnation)
	if err := s.net.Teardown(ctx, id); err != nil {
		return apierr.Unavailable("tear down network of sandbox %q: %v", sb.Name, err)
	}
	s.netMu.Lock()
	delete(s.nets, id)
	s.netMu.Unlock()
	return nil
}

// warnRootContained says, once per policy change, what netpolicy's threat
// model says: a command running as host root can leave any namespace
// (setns to /proc/1/ns/net, or write a file the host runs), so a policy
// contains it in name only. Run contained sandboxes with a user.
func (s *Manager) warnRootContained(sb registry.Sandbox) {
	if os.Geteuid() != 0 || sb.Identity != nil {
		return
	}
	if sb.User != "" && sb.User != "root" && sb.User != "0" && !strings.HasPrefix(sb.User, "0:") {
		return
	}
	s.log.Warn("sandbox is contained but its commands run as root, who can leave the network namespace: create it with a non-root user for real containment", "sandbox", sb.Name)
}

// ParseNetwork validates a requested policy and returns it normalized.
func ParseNetwork(n wire.Network) (*wire.Network, error) {
	if n.Allow == nil {
		return nil, apierr.Invalid("network: allow is required (allow: [] denies all egress)")
	}
	p, err := netpolicy.ParsePolicy(netpolicy.Policy{Allow: n.Allow})
	if err != nil {
		return nil, apierr.Invalid("network: %v", err)
	}
	return &wire.Network{Allow: p.Allow}, nil
}

func sameNetwork(a, b *wire.Network) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Allow, b.Allow)
}

// CanSetNetwork is what a policy request checks before its body is read:
// sandbox name exists (not_found only when the registry says so), and
// policies are enforced here (not_supported otherwise).
func (s *Manager) CanSetNetwork(name string) error {
	if _, err := s.Get(name); err != nil {
		return err
	}
	if s.net == nil {
		return ErrNoNetPolicy()
	}
	return nil
}

// SetNetwork validates req and sets it as sandbox name's network policy:
// the record first, then the namespace (ensureNet); a namespace that
// cannot be set up restores the policy before (restorePolicy).
func (s *Manager) SetNetwork(ctx context.Context, name string, req wire.Network) (registry.Sandbox, error) {
	policy, err := ParseNetwork(req)
	if err != nil {
		return registry.Sandbox{}, err
	}
	unlock := s.locks.Lock(name)
	defer unlock()
	sb, err := s.Scoped(ctx, name)
	if err != nil {
		return sb, err
	}
	if err := s.checkContainable(sb); err != nil {
		return sb, err
	}
	if sb.Network == nil {
		if err := s.sessions.RefuseUncontained(ctx, name); err != nil {
			return sb, err
		}
	}
	// The record first: from here on every spawn goes into the namespace
	// (or is refused until it exists).
	old := sb
	sb, err = s.reg.UpdateSandbox(name, func(rec *registry.Sandbox) error {
		rec.Isolated = rec.Isolated || s.Isolating(true)
		rec.Network = policy
		return nil
	})
	if err != nil {
		return sb, s.RegistryErr(err, name)
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := s.ensureNet(nctx, sb); err != nil {
		return sb, s.restorePolicy(nctx, old, err)
	}
	s.log.Info("sandbox network policy set", "sandbox", name, "allow", policy.Allow)
	s.warnRootContained(sb)
	return sb, nil
}

// restorePolicy follows a policy the kernel did not take (failed, the
// sandbox now denies all egress): the policy old had is applied again and
// recorded, so GET shows what the kernel holds; where there is none to
// go back to (the sandbox was on the host network) or it cannot be
// applied either, the record says deny-all (allow: []), which is what the
// namespace enforces. The answer says which. The caller holds the lock.
func (s *Manager) restorePolicy(ctx context.Context, old registry.Sandbox, failed error) error {
	holds := "it now denies all egress"
	network := &wire.Network{Allow: []string{}}
	if old.Network != nil {
		if _, err := s.ensureNet(ctx, old); err == nil {
			network, holds = old.Network, "the old policy stays in force"
		} else {
			s.log.Error("restore the old network policy after a failed update; the sandbox denies all egress", "sandbox", old.Name, "err", err)
		}
	}
	if _, err := s.reg.UpdateSandbox(old.Name, func(rec *registry.Sandbox) error {
		rec.Network = network
		return nil
	}); err != nil {
		s.log.Error("record the network policy in force after a failed update", "sandbox", old.Name, "err", err)
	}
	var ae *apierr.Error
	if errors.As(failed, &ae) {
		cp := *ae
		cp.Detail += "; " + holds
		return &cp
	}
	return apierr.Unavailable("%v; %s", failed, holds)
}

// NetReady returns sb's network namespace when it needs nothing set up:
// none (not contained), or one this runnerd has already made. ok is
// false when NetFor would have work to do.
func (s *Manager) NetReady(sb registry.Sandbox) (nsb *netpolicy.Sandbox, ok bool) {
	if sb.Network == nil {
		return nil, true
	}
	if s.net == nil {
		return nil, false
	}
	s.netMu.Lock()
	defer s.netMu.Unlock()
	nsb = s.nets[NetID(sb.Name, sb.Incarnation)]
	return nsb, nsb != nil
}
