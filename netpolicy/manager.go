package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/agentrunner/runner/internal/keyed"
	"github.com/google/nftables"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultPool is the address pool used when Config.Pool is unset: 16384
// sandboxes, one /30 each.
var DefaultPool = netip.MustParsePrefix("10.213.0.0/16")

// DefaultTable is the nftables table (family inet) used when Config.Table
// is unset.
const DefaultTable = "runner"

// Errors. Match them with errors.Is.
var (
	// ErrUnsupported is returned (wrapped) by New when this host cannot
	// enforce a network policy: not root (no CAP_NET_ADMIN / CAP_SYS_ADMIN),
	// or a kernel without network namespaces, nf_tables or NAT. The daemon
	// must then not advertise the network_policy capability.
	ErrUnsupported = errors.New("network policy not supported on this host")
	// ErrUnknownSandbox is returned by SetPolicy and Policy for an id that
	// has not been Setup by this Manager (after a restart, call Setup
	// again first), or was torn down.
	ErrUnknownSandbox = errors.New("unknown sandbox")
	// ErrInvalidID is returned when an id is not a DNS label.
	ErrInvalidID = errors.New("invalid sandbox id")
	// ErrPoolExhausted is returned by Setup when every /30 of the pool is
	// taken.
	ErrPoolExhausted = errors.New("address pool exhausted")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("netpolicy manager closed")
)

// Config configures a Manager.
type Config struct {
	// StateDir holds the package's files: sandboxes/ID.json (allocation
	// and policy), netns/ID (the bind-mounted namespace, like
	// `ip netns add`), resolv/ID.conf. Required. The netns/ mounts must be
	// visible to the shim, so StateDir must live in the host's mount
	// namespace (no systemd PrivateMounts for runnerd); a tmpfs such as
	// /run/runner/netpolicy suits it, since namespaces die at reboot.
	StateDir string
	// Pool is the IPv4 pool carved into one /30 per sandbox (.1 host side
	// and resolver, .2 the sandbox). Default DefaultPool. It must not
	// overlap a network the host routes to or the sandboxes need.
	Pool netip.Prefix
	// Upstream lists the DNS servers the resolver forwards allowed names
	// to. Default: the nameservers in the host's /etc/resolv.conf.
	Upstream []netip.AddrPort
	// Table is the nftables inet table the package owns. Default
	// DefaultTable. Its sandboxes' veths are named with IfPrefix(Table),
	// and its rules touch only interfaces with that prefix and the Pool,
	// so Managers with different tables (and prefixes) and disjoint pools
	// coexist in one namespace; two with the same table remove each
	// other's sandboxes (New removes what it has no record of).
	Table string
	// HostNetNS is the path of the network namespace that plays "host":
	// where the veths' host ends, the rules, the NAT and the resolver
	// live. Empty means the namespace runnerd runs in (production). Tests
	// set it to a namespace they created, so the real host is untouched.
	HostNetNS string
}

// Sandbox describes a sandbox's network as Setup made it.
type Sandbox struct {
	ID string
	// NetNSPath is the bind-mounted network namespace file; the shim
	// enters it (setns) before exec of the command.
	NetNSPath string
	// Addr is the sandbox's address on its eth0 (a /30).
	Addr netip.Addr
	// Gateway is the host end of the veth, the default route, and where
	// the sandbox's DNS resolver listens (port 53, UDP and TCP).
	Gateway netip.Addr
	// ResolvConfPath is a resolv.conf naming Gateway, for the shim to
	// bind-mount over /etc/resolv.conf in the command's mount namespace.
	ResolvConfPath string
}

// Manager creates sandbox network namespaces and enforces their egress
// policies. It is safe for concurrent use. Close it to stop the DNS
// resolvers; sandboxes outlive it (and the daemon) until Teardown.
type Manager struct {
	cfg      Config
	upstream []netip.AddrPort
	hostNS   netns.NsHandle
	ownNS    bool // hostNS is the namespace the process runs in
	hostH    *netlink.Handle

	adm   *admitter   // the admission writer; started by New, stopped by Close
	rw    *ruleWriter // the rule writer; started by New, stopped by Close
	stats stats
	// addRefreshes says whether this kernel restarts a present set
	// element's timeout on "add" (probed by New; a test may clear it).
	addRefreshes bool
	// dynMu orders the admission writer's commits with the flushes of
	// dynamic sets (SetPolicy, denyAll) and guards every resolver's
	// admitted map. Lock order: ids' lock of a sandbox, then dynMu, then
	// mu.
	dynMu sync.Mutex
	// ids serializes the changes of one sandbox (Setup, SetPolicy,
	// Teardown); changes of different sandboxes run concurrently, and
	// their nftables transactions meet in the rule writer.
	ids keyed.Mutex
	// inflight counts the calls under way; Close waits for them.
	inflight sync.WaitGroup
	// links holds a token per link operation in progress (linkSlots).
	links chan struct{}

	// mu guards the fields below. It is a leaf: nothing else is taken,
	// and nothing blocks in the kernel, while it is held.
	mu        sync.Mutex
	records   map[string]record
	live      map[string]*live
	forwardOn bool
	closed    bool

	// failSetPolicy, when set by a test, makes SetPolicy's kernel update
	// fail after the sets were changed, to exercise the fail-closed path.
	failSetPolicy error
	// skipCut, when set by a test, makes SetPolicy leave conntrack alone,
	// to show that the cut is what ends revoked flows.
	skipCut bool
	// minAdmitTTL and maxAdmitTTL bound the lifetime of a resolver-
	// admitted address: the constants in production, shorter in a test
	// that watches an element time out.
	minAdmitTTL, maxAdmitTTL time.Duration
	// dialNFT, when set (golden tests), opens the nftables connections
	// instead of the kernel in hostNS.
	dialNFT func() (*nftables.Conn, error)
}

// live is a sandbox set up by this Manager.
type live struct {
	pp  *parsedPolicy
	res *resolver
}

// New checks that the host can enforce policies and prepares the nftables
// table (get-or-create, idempotent). It does not touch existing sandboxes:
// call Setup for each known sandbox to re-adopt it. New returns an error
// wrapping ErrUnsupported when the host cannot enforce.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.StateDir == "" {
		return nil, errors.New("create netpolicy manager: StateDir is required")
	}
	if !cfg.Pool.IsValid() {
		cfg.Pool = DefaultPool
	}
	cfg.Pool = cfg.Pool.Masked()
	if !cfg.Pool.Addr().Is4() || poolSlots(cfg.Pool) == 0 {
		return nil, fmt.Errorf("create netpolicy manager: pool %s is not an IPv4 prefix of /30 or wider", cfg.Pool)
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	m := &Manager{cfg: cfg, records: map[string]record{}, live: map[string]*live{}, minAdmitTTL: minAdmitTTL, maxAdmitTTL: maxAdmitTTL,
		links: make(chan struct{}, linkSlots)}
	m.upstream = cfg.Upstream
	if len(m.upstream) == 0 {
		m.upstream = systemUpstreams()
	}
	if err := probeNetNS(); err != nil {
		return nil, unsupported("create network namespace", err)
	}
	var err error
	if cfg.HostNetNS == "" {
		m.ownNS = true
		m.hostNS, err = netns.Get()
	} else {
		m.hostNS, err = netns.GetFromPath(cfg.HostNetNS)
	}
	if err != nil {
		return nil, unsupported("open host netns", err)
	}
	if m.hostH, err = netlink.NewHandleAt(m.hostNS); err != nil {
		m.hostNS.Close()
		return nil, unsupported("open netlink", err)
	}
	if err := m.ensureTable(); err != nil {
		m.hostH.Close()
		m.hostNS.Close()
		return nil, unsupported("prepare nftables", err)
	}
	if m.records, err = m.loadRecords(); err != nil {
		m.hostH.Close()
		m.hostNS.Close()
		return nil, err
	}
	if err := m.removeStale(); err != nil {
		m.hostH.Close()
		m.hostNS.Close()
		return nil, err
	}
	if m.addRefreshes, err = m.probeAddRefresh(); err != nil {
		m.hostH.Close()
		m.hostNS.Close()
		return nil, err
	}
	m.startRuleWriter()
	m.startAdmitter()
	return m, nil
}

// begin admits a call unless the Manager is closed; the caller runs
// m.inflight.Done when it ends.
func (m *Manager) begin() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.inflight.Add(1)
	return nil
}

// enter admits a call on sandbox id: a valid id, a live ctx, a Manager
// not closed, and id's lock held, in that order. The caller runs done
// when the call ends; it releases the lock and the admission.
func (m *Manager) enter(ctx context.Context, id string) (done func(), err error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.begin(); err != nil {
		return nil, err
	}
	unlock := m.ids.Lock(id)
	return func() {
		unlock()
		m.inflight.Done()
	}, nil
}

// liveOf returns the sandbox's live state, nil if it has none.
func (m *Manager) liveOf(id string) *live {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

// recordOf returns the sandbox's record.
func (m *Manager) recordOf(id string) (record, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.records[id]
	return r, ok
}

// removeStale removes the rules and sets of sandboxes that are dispatched
// in the kernel but have no record (their Teardown did not finish).
// Sandboxes with a record keep everything until Setup re-adopts them.
func (m *Manager) removeStale() error {
	if err := m.removeLegacyChains(); err != nil {
		return err
	}
	stale, err := m.staleSandboxes()
	if err != nil {
		return fmt.Errorf("find stale sandboxes: %w", err)
	}
	for _, id := range stale {
		n := m.namesFor(id)
		gws, err := m.gatewaysOf(n.hostIf)
		if err != nil {
			return fmt.Errorf("remove stale sandbox %s: %w", id, err)
		}
		if err := m.removeSandboxRules(context.Background(), n, gws); err != nil {
			return fmt.Errorf("remove stale sandbox %s: %w", id, err)
		}
	}
	return nil
}

// unsupported wraps err with ErrUnsupported when it says the host lacks a
// permission or a kernel feature; other errors stay as they are.
func unsupported(what string, err error) error {
	for _, e := range []error{unix.EPERM, unix.EACCES, unix.EOPNOTSUPP, unix.EAFNOSUPPORT,
		unix.EPROTONOSUPPORT, unix.ENOSYS} {
		if errors.Is(err, e) {
			return fmt.Errorf("%s: %w: %w", what, ErrUnsupported, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// probeNetNS checks that this process may create network namespaces.
func probeNetNS() error {
	nsh, err := newNetNS()
	if err != nil {
		return err
	}
	return nsh.Close()
}

func systemUpstreams() []netip.AddrPort {
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	port, err := strconv.Atoi(cc.Port)
	if err != nil {
		port = 53
	}
	var out []netip.AddrPort
	for _, s := range cc.Servers {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.AddrPortFrom(a, uint16(port)))
		}
	}
	return out
}

// inHost runs fn with the calling thread in the host namespace, so the
// sockets it creates live there.
func (m *Manager) inHost(fn func() error) error {
	if m.ownNS {
		return fn()
	}
	return inNetNS(m.hostNS, fn)
}

// checkID accepts a DNS label: 1-63 of [a-z0-9-], not starting or ending
// with '-'.
func checkID(id string) error {
	if len(id) == 0 || len(id) > 63 || id[0] == '-' || id[len(id)-1] == '-' {
		return fmt.Errorf("%w: %q", ErrInvalidID, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%w: %q", ErrInvalidID, id)
		}
	}
	return nil
}

// SetPolicy replaces the sandbox's allowlist. An empty allowlist denies
// everything. An invalid policy (ErrInvalidPolicy) changes nothing. Any
// other failure leaves the sandbox denying everything (fail closed) and
// Policy then reports the empty allowlist. Removing a name also revokes
// the addresses the resolver admitted for names. Revocation cuts: before
// SetPolicy returns, the conntrack entries of the sandbox's flows to
// destinations the new policy no longer allows are deleted, so their next
// packet is judged by the new policy and refused.
func (m *Manager) SetPolicy(ctx context.Context, id string, p Policy) error {
	if err := checkID(id); err != nil {
		return err
	}
	pp, err := parsePolicy(p)
	if err != nil {
		return fmt.Errorf("set policy of %s: %w", id, err)
	}
	done, err := m.enter(ctx, id)
	if err != nil {
		return err
	}
	defer done()
	l := m.liveOf(id)
	if l == nil {
		return fmt.Errorf("set policy of %s: %w", id, ErrUnknownSandbox)
	}
	rec, _ := m.recordOf(id)
	if slices.Equal(l.pp.norm.Allow, pp.norm.Allow) && slices.Equal(rec.Policy.Allow, pp.norm.Allow) {
		// What the kernel enforces and the record says already: nothing
		// to write and nothing revoked (a re-adoption re-applies the
		// registry's policy, the same one, for every sandbox).
		return nil
	}
	n := m.namesFor(id)
	flushDyn := !l.pp.namesSubsetOf(pp)
	rec.Policy = pp.norm
	if flushDyn {
		// Narrow the resolver and flush under dynMu, which the admission
		// writer holds from its policy check to its commit: an answer
		// for a revoked name lands before the flush or never.
		m.dynMu.Lock()
		l.res.policy.Store(pp)
		err = m.setStatic(ctx, n, pp.prefixes, true)
		m.forgetAdmitted(id)
		m.dynMu.Unlock()
	} else {
		err = m.setStatic(ctx, n, pp.prefixes, false)
	}
	if err == nil && m.failSetPolicy != nil {
		err = m.failSetPolicy
	}
	if err == nil {
		err = m.saveRecord(rec)
	}
	_, gw, addr := slotAddrs(m.cfg.Pool, rec.Slot)
	bg := context.WithoutCancel(ctx) // failing closed is not cancelled
	if err != nil {
		deny, _ := parsePolicy(Policy{})
		l.pp = deny
		l.res.policy.Store(deny)
		rec.Policy = deny.norm
		m.setRecord(rec)
		derr := m.denyAll(bg, n)
		return errors.Join(fmt.Errorf("set policy of %s: %w", id, err), derr, m.saveRecord(rec),
			m.cutFlows(n, addr, gw, nil, derr != nil))
	}
	revokes := flushDyn || !l.pp.rangesWithin(pp)
	l.pp = pp
	l.res.policy.Store(pp)
	m.setRecord(rec)
	if !revokes {
		// A policy that only adds (a new sandbox's first, from deny
		// all) cuts nothing: no conntrack dump (a walk of the host's
		// whole table, one at a time on the netlink handle).
		return nil
	}
	if err := m.cutFlows(n, addr, gw, pp.prefixes, flushDyn); err != nil {
		// The sets already deny; a flow we failed to cut is the one
		// thing left open, so fail closed and say so.
		deny, _ := parsePolicy(Policy{})
		l.pp = deny
		l.res.policy.Store(deny)
		rec.Policy = deny.norm
		m.setRecord(rec)
		return errors.Join(fmt.Errorf("set policy of %s: %w", id, err), m.denyAll(bg, n), m.saveRecord(rec))
	}
	return nil
}

func (m *Manager) setRecord(r record) {
	m.mu.Lock()
	m.records[r.ID] = r
	m.mu.Unlock()
}

// Policy returns the sandbox's policy as enforced, normalized.
func (m *Manager) Policy(ctx context.Context, id string) (Policy, error) {
	if err := checkID(id); err != nil {
		return Policy{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Policy{}, ErrClosed
	}
	if m.live[id] == nil {
		return Policy{}, fmt.Errorf("policy of %s: %w", id, ErrUnknownSandbox)
	}
	return Policy{Allow: append([]string{}, m.records[id].Policy.Allow...)}, nil
}

// Close stops every resolver and releases the Manager's handles. It does
// not tear down sandboxes: their namespaces, links and rules stay, and
// keep denying, until a new Manager re-adopts them. Idempotent.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	// Calls under way finish (their kernel changes commit or fail as a
	// whole); new ones get ErrClosed.
	m.inflight.Wait()
	m.mu.Lock()
	lives := m.live
	m.live = map[string]*live{}
	m.mu.Unlock()
	for _, l := range lives {
		l.res.close()
	}
	m.adm.close()
	m.rw.close()
	m.hostH.Close()
	return m.hostNS.Close()
}
