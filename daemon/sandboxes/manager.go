package sandboxes

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/internal/keyed"
	"github.com/agentrunner/runner/netpolicy"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
)

// Config is what the sandboxes manager needs of runnerd's configuration,
// normalized by the daemon (daemon.Config) before New.
type Config struct {
	StateDir string
	// IsolateAll isolates every sandbox (--isolate all); otherwise only
	// a contained one is (--isolate none).
	IsolateAll                  bool
	IdentityFirst, IdentityLast uint32
	// Pods makes every sandbox a pod (--isolate pod, pods.go): then the
	// identity range is the pods' subordinate range, handed out in blocks
	// of pod.BlockSize. PodHolder is the holder's argv (the shim program
	// and its pod mode).
	Pods      bool
	PodHolder []string
	// PodBinds are the operator's host paths bound into every pod.
	PodBinds []pod.Bind
	// EgressPrivate puts the private networks in an isolated sandbox's
	// open egress (--egress-private allow).
	EgressPrivate bool
	// TerminateGrace is the grace of the SIGTERM before SIGKILL when
	// destroy stops sessions; suspend uses SuspendGrace.
	TerminateGrace, SuspendGrace time.Duration

	// Cgroups asks for a cgroup per sandbox (--cgroups auto).
	Cgroups       bool
	CgroupRoot    string
	DefaultLimits wire.Limits
	// LeafSweepInterval is how often the sweep looks for session leaves
	// whose session has ended and which hold no process any more.
	LeafSweepInterval time.Duration

	// NetPolicy asks for network containment (--netpolicy auto), kept
	// in NetPolicyState under nftables table NetTable.
	NetPolicy          bool
	NetPolicyState     string
	NetTable           string
	NetPolicyPool      netip.Prefix
	DNSUpstream        []netip.AddrPort
	NetPolicyHostNetNS string

	// Storage is the storage driver of sandboxes' disks (--storage):
	// storage.Btrfs, storage.Ext4, storage.Dir (no budgets) or
	// StorageAuto; StorageSize the btrfs pool file's size (0: the
	// storage package's default); DefaultDisk the disk_bytes of a
	// sandbox created without one, where budgets are enforced (disk.go).
	Storage     string
	StorageSize int64
	DefaultDisk int64
}

// Sessions is what the sandboxes manager asks of the sessions of a
// sandbox, which it does not own (package daemon's sessions side does):
// the import arrow runs from sessions to sandboxes, never back, so this
// is an interface the session side implements and hands to New.
type Sessions interface {
	// StopAll terminates every session of sandbox name and every process
	// a session started, with grace before SIGKILL, and returns the
	// sessions' records. The caller holds the sandbox's lock.
	StopAll(ctx context.Context, name string, grace time.Duration) ([]registry.Session, error)
	// Dir is the directory of session ss (its journal included).
	Dir(ss registry.Session) string
	// RefuseUncontained returns a conflict while a process of sandbox
	// name runs on the host network (a running session, or one that
	// outlived its command).
	RefuseUncontained(ctx context.Context, name string) error
	// Refresh brings ss's record up to date from its shim's own files
	// (its exit, once it has one).
	Refresh(ss registry.Session) (registry.Session, error)
	// Forget drops what the session side keeps about a destroyed
	// sandbox (journal budgets, session counts).
	Forget(name string)
}

// Metrics is what the manager reports to runnerd's metrics.
type Metrics interface {
	ObserveCheckpoint(d, frozen time.Duration, stored int64)
	ObserveRestore(d time.Duration)
}

// Manager owns the sandboxes of one runnerd: their lifecycle (create,
// suspend, resume, destroy), identities, private directories and passwd
// files, cgroups and limits, network namespaces and policies, and
// checkpoints. The registry is the source of truth below it; every
// method that changes a sandbox holds that sandbox's lock (Locks), so a
// spawn, which takes the same lock, never races a destroy.
//
// Its methods take a context and typed arguments and return typed
// results and *apierr.Error for what the contract names; none sees an
// HTTP request. Safe for concurrent use once Start has returned; fields
// set by Start (cg, net, ids, pool) are read-only afterwards.
type Manager struct {
	cfg      Config
	log      *slog.Logger
	reg      *registry.Registry
	locks    *keyed.Mutex
	sessions Sessions
	metrics  Metrics

	net    *netpolicy.Manager // nil when network policies are not enforced
	cg     *cgroup.Manager    // nil when resource limits are not enforced (limits.go)
	pool   *storage.Pool      // nil on the dir driver: no disk budgets (disk.go)
	ids    identities         // isolation policy (identity.go)
	leaves releasedLeaves     // OOM kills of session leaves the sweep removed (limits.go)
	pods   pods               // the holders this runnerd made or adopted (pods.go)

	netMu sync.Mutex                    // guards nets
	nets  map[string]*netpolicy.Sandbox // by NetID: namespaces this runnerd set up
	// netPending counts the contained sandboxes the background
	// re-adoption (adoptNets) has not yet reached or finished.
	netPending atomic.Int64

	// life bounds the background adoption of cgroups and networks; it
	// ends when runnerd begins shutting down.
	life context.Context
}

// New returns the manager of the sandboxes reg records. locks is the
// per-sandbox lock the session side takes too; life bounds the
// background work Start begins. sessions and metrics may be set later
// with SetSessions before anything is served.
func New(life context.Context, cfg Config, log *slog.Logger, reg *registry.Registry, locks *keyed.Mutex, metrics Metrics) *Manager {
	return &Manager{cfg: cfg, log: log, reg: reg, locks: locks, metrics: metrics, life: life,
		nets: map[string]*netpolicy.Sandbox{}}
}

// SetSessions hands the manager the session side it stops and asks (see
// Sessions); called once, before anything is served.
func (s *Manager) SetSessions(ss Sessions) { s.sessions = ss }

// Locks is the per-sandbox lock: whoever changes a sandbox's set of
// processes holds it.
func (s *Manager) Locks() *keyed.Mutex { return s.locks }

// NetPolicy is the network containment manager, nil when policies are
// not enforced.
func (s *Manager) NetPolicy() *netpolicy.Manager { return s.net }

// Cgroups is the cgroup manager, nil when limits are not enforced.
func (s *Manager) Cgroups() *cgroup.Manager { return s.cg }

// NetsPending counts the contained sandboxes whose network the
// background re-adoption has not yet reached.
func (s *Manager) NetsPending() int64 { return s.netPending.Load() }

// IdentitiesEnabled says runnerd is root and isolated sandboxes get an
// identity of their own.
func (s *Manager) IdentitiesEnabled() bool { return s.ids.enabled }
