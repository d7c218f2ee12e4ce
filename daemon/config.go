package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/podjoin"
	"github.com/agentrunner/runner/storage"
	"github.com/agentrunner/runner/wire"
)

// DefaultListen is the TCP address runnerd listens on when none is given.
const DefaultListen = "127.0.0.1:7323"

// DefaultWarmShims is Config.WarmShims when it is 0.
const DefaultWarmShims = 2

// DefaultMaxExecs is Config.MaxExecs when it is 0.
const DefaultMaxExecs = 32

// Environment variables runnerd reads (cmd/runnerd documents them in --help).
const (
	EnvState  = "RUNNERD_STATE"
	EnvToken  = "RUNNERD_TOKEN"
	EnvListen = "RUNNERD_LISTEN"
	EnvSocket = "RUNNERD_SOCKET"
	// EnvMetricsListen is the default of --metrics-listen (Config.MetricsListen).
	EnvMetricsListen = "RUNNERD_METRICS_LISTEN"
	// EnvPreviewListen and EnvPreviewURL configure the preview listener.
	EnvPreviewListen = "RUNNERD_PREVIEW_LISTEN"
	EnvPreviewURL    = "RUNNERD_PREVIEW_URL"
	// EnvNetPolicy and EnvNetPolicyState configure network containment
	// (flags --netpolicy, --netpolicy-state).
	EnvNetPolicy      = "RUNNERD_NETPOLICY"
	EnvNetPolicyState = "RUNNERD_NETPOLICY_STATE"
)

// Network policy modes (Config.NetPolicy).
const (
	// NetPolicyAuto enforces network policies when this host can
	// (netpolicy.New succeeds: root, network namespaces, nf_tables), and
	// otherwise refuses them with not_supported and says why in the log.
	NetPolicyAuto = "auto"
	// NetPolicyOff never enforces them: network_policy is not advertised
	// and runnerd does not touch the host's network configuration.
	NetPolicyOff = "off"
)

// Private egress modes (Config.EgressPrivate): whether the open egress
// an isolated sandbox gets without a policy reaches private networks.
const (
	// EgressPrivateDeny leaves them out (the default): the open egress is
	// netpolicy.PublicEgress, every IPv4 destination but RFC 1918 and
	// 100.64.0.0/10. The operator's internal network and a cluster's
	// services are where an agent's hostile command does harm beyond
	// sending data out, and they are often unauthenticated; a sandbox that
	// needs one names it in its policy.
	EgressPrivateDeny = "deny"
	// EgressPrivateAllow puts them in: netpolicy.OpenEgress, 0.0.0.0/0.
	EgressPrivateAllow = "allow"
)

// Isolation modes (Config.Isolate). The default (empty) is IsolatePod
// when runnerd runs as root and can make pods (else IsolateAll), and
// IsolateNone when it is not root.
const (
	// IsolateAll isolates every sandbox: its commands run as a uid of its
	// own with no way back to privilege, and (where network policies are
	// enforced) in a network namespace of its own, whose egress is open
	// but never to the host unless a policy narrows it. It needs runnerd
	// to run as root. The default as root where pods cannot be made.
	IsolateAll = "all"
	// IsolateNone opts out, for a VM that is itself the boundary: a
	// sandbox without a network policy runs as its user or as runnerd's
	// (root: it reads runnerd's token, sees and signals every process,
	// writes the host), on the host's network. A sandbox with a policy is
	// still isolated, since root could undo the policy. The default where
	// runnerd is not root.
	IsolateNone = "none"
	// IsolateContained is the former name of IsolateNone, still accepted.
	IsolateContained = "contained"
	// IsolatePod is IsolateAll with each sandbox a pod (package pod;
	// docs/isolation.md, "The pod"): made once at create, root inside a
	// user namespace of its own mapped to a block of 65,536 unprivileged
	// ids outside, its own processes (pid namespace), files (an overlay
	// root over the host's system directories), IPC and host name. It
	// needs root, user namespaces and a runnerd built with cgo. The
	// default as root where it has them.
	IsolatePod = "pod"
)

// DefaultIdentityFirst and DefaultIdentityLast bound the uids (and gids)
// runnerd gives isolated sandboxes: 0x70000000-0x7000FFFF. systemd's
// table of UID ranges (https://systemd.io/UIDS-GIDS/) leaves
// 1879048192-2147352575 unused: above the nspawn container ranges
// (524288-1879048191), below the foreign range (2147352576) and 2^31 (which
// some tools read as negative), and far from users (< 60001), homed
// (60001-60513), DynamicUser (61184-65519), nobody (65534) and the
// subordinate ids useradd hands out by default (100000-600100000). A uid
// that resolves through NSS is skipped at allocation anyway.
const (
	DefaultIdentityFirst = 0x70000000
	DefaultIdentityLast  = 0x7000FFFF
)

// EnvIsolate and EnvIdentityRange configure isolation (flags --isolate,
// --identity-range).
const (
	EnvIsolate       = "RUNNERD_ISOLATE"
	EnvIdentityRange = "RUNNERD_IDENTITY_RANGE"
)

// ParseIdentityRange parses "FIRST-LAST" (inclusive uids).
// ParseBind parses an operator's bind (--bind): SOURCE:TARGET or
// SOURCE:TARGET:rw, a host path bound at TARGET in every pod, read-only
// unless rw.
func ParseBind(s string) (pod.Bind, error) {
	parts := strings.Split(s, ":")
	switch {
	case len(parts) == 2:
		return pod.Bind{Source: parts[0], Target: parts[1]}, nil
	case len(parts) == 3 && (parts[2] == "rw" || parts[2] == "ro"):
		return pod.Bind{Source: parts[0], Target: parts[1], Writable: parts[2] == "rw"}, nil
	}
	return pod.Bind{}, fmt.Errorf("bind %q: want SOURCE:TARGET[:ro|rw]", s)
}

func ParseIdentityRange(s string) (first, last uint32, err error) {
	a, b, ok := strings.Cut(s, "-")
	f, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	l, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("identity range %q: want FIRST-LAST", s)
	}
	return uint32(f), uint32(l), nil
}

// DefaultNetPolicyState is where network containment keeps its files
// (namespace mounts, resolv.conf files, address slots) when /run is
// writable: a tmpfs, like the namespaces themselves, gone at reboot.
const DefaultNetPolicyState = "/run/runnerd/netpolicy"

// Config is everything Run needs. The zero value is a working
// configuration: Run fills every unset field (StateDir from
// DefaultStateDir).
type Config struct {
	// StateDir holds registry.db, token, runnerd.sock, sandboxes/ and s/.
	StateDir string
	// Listen is the TCP address to serve on; "none" disables TCP.
	Listen string
	// Socket is the unix socket path to serve on; "none" disables it.
	Socket string
	// Token is the bearer token; empty means read STATE/token, generating
	// it on first start.
	Token string
	// ShimCommand is the argv prefix that runs the shim's main (shim.Main),
	// to which the shim appends its own arguments. Default: this executable
	// with the hidden "shim" subcommand.
	ShimCommand []string
	// WarmShims is how many pre-started shims runnerd keeps waiting for a
	// session (launch.Pool), so that a spawn costs the command's fork/exec
	// instead of two process starts. 0 means DefaultWarmShims; negative
	// disables the pool (every spawn starts its shim cold). Each idle warm
	// shim costs about what an idle session's shim does (~1.5 MiB private).
	WarmShims int
	// DiskReserve is the space runnerd sets aside on the state file system
	// (STATE/registry.reserve) for the registry commits that must land
	// when the disk is full: terminate, signal, delete, suspend, destroy.
	// 0 means DefaultDiskReserve (docs/operations.md, "When the
	// disk fills").
	DiskReserve int64
	// MaxExecs bounds the execs in flight: each buffers up to twice
	// wire.MaxExecOutput plus its JSON answer, so the bound is runnerd's
	// exec memory. An exec beyond it is answered 429 rate_limited. 0 means
	// DefaultMaxExecs.
	MaxExecs int
	// Capacity bounds what this host takes (capacity.go); zero: no bound.
	Capacity CapacityLimits
	// MaxSandboxSessions bounds the sessions of one sandbox whose shim
	// may live: running, or ended with processes left (sessions_cap.go).
	// A create of one more is answered 409 invalid, detail
	// wire.DetailSessionCap. 0: no bound (runnerd's --sandbox-max-sessions
	// defaults to DefaultSandboxSessions).
	MaxSandboxSessions int
	// MaxSandboxEndedSessions bounds the ended sessions one sandbox keeps:
	// past it the oldest (in listing order) are deleted as DELETE does,
	// never refused (sessions_cap.go). 0: no bound, ended sessions are
	// kept until deleted (runnerd's --sandbox-max-ended-sessions defaults
	// to DefaultSandboxEndedSessions).
	MaxSandboxEndedSessions int
	// SandboxJournalBytes bounds the bytes the journals of one sandbox's
	// sessions hold together, running or ended until deleted
	// (journalcap.go): output past it ends its session, and a create is
	// answered 409 invalid, detail wire.DetailJournalCap. 0: no bound
	// (runnerd's --sandbox-journal-bytes defaults to
	// DefaultSandboxJournalBytes).
	SandboxJournalBytes int64
	// pool holds the warm shims; set by Run, nil when disabled.
	pool *launch.Pool
	// netTable is the nftables table of this runnerd's network policy;
	// set by claimHost (claim.go), "" with network policy off.
	netTable string
	// TerminateGrace is the grace of the SIGTERM before SIGKILL when destroy
	// stops sessions. Suspend uses SuspendGrace.
	TerminateGrace time.Duration
	SuspendGrace   time.Duration
	// ShutdownTimeout bounds how long Run waits for in-flight requests when
	// its context ends. Attaches are closed at once (clients reattach).
	ShutdownTimeout time.Duration
	// SessionRetention, when positive, is how long an ended session is
	// kept after its exit: a janitor then deletes it exactly as DELETE
	// /v1/sandboxes/{name}/sessions/{id} does (record, directory,
	// journal); one whose shim still lives is kept. 0 keeps every session
	// until its sandbox is destroyed. A control plane must persist what it
	// needs of a session before the retention removes it.
	SessionRetention time.Duration
	// JanitorInterval is how often the retention janitor looks; 0 means
	// SessionRetention/10, at least 1s and at most 1 min. For tests.
	JanitorInterval time.Duration
	// JournalRetainBytes caps each stream's journal of the sessions
	// started from now on (sessiondir.Spec.RetainBytes): whole oldest segments
	// are dropped while a stream holds more, and a reader behind them is
	// answered truncated. 0 keeps everything.
	JournalRetainBytes int64
	// PreviewListen is the address of the preview listener and
	// PreviewURLTemplate how its URLs look (package preview), e.g.
	// "http://{token}.localhost:7324/". Both empty: no preview listener,
	// public_url is not advertised.
	PreviewListen      string
	PreviewURLTemplate string
	// MetricsListen is the address of a listener that serves GET /metrics
	// (and GET /healthz) without the token, for a scraper that must not
	// hold the credential that controls every sandbox (as kubelet's and
	// containerd's metrics ports). A bare port (":9323" or "9323") means
	// loopback (127.0.0.1:9323); another host is served only when named.
	// Empty: none (/metrics is served on the API listeners, with the token).
	MetricsListen string
	// MetricsListener, when set, is served as the metrics listener instead
	// of listening on MetricsListen (for tests). Run closes it.
	MetricsListener net.Listener

	// TLSCert and TLSKey are PEM files of the TCP listeners' certificate
	// and key (tls.go): both or neither. They are read again when they
	// change. TLSClientCA, when set, is a PEM file of the CAs whose client
	// certificates the API listener requires (the bearer token is still
	// required too). InsecureListen allows plain HTTP on a non-loopback
	// address, which Run otherwise refuses with ErrInsecureListen.
	TLSCert, TLSKey, TLSClientCA string
	InsecureListen               bool

	// NetPolicy is NetPolicyAuto (the default when empty) or NetPolicyOff.
	NetPolicy string
	// NetPolicyState is netpolicy's state directory. Default
	// DefaultNetPolicyState, or STATE/netpolicy when /run is not writable.
	// The registry, not this directory, is the record of which sandboxes
	// have a network and their policies; runnerd re-applies it at start.
	NetPolicyState string
	// NetPolicyPool is the IPv4 pool carved into one /30 per contained
	// sandbox; the zero value means netpolicy.DefaultPool.
	NetPolicyPool netip.Prefix
	// DNSUpstream lists the DNS servers the sandboxes' resolvers forward
	// allowed names to; empty means the host's /etc/resolv.conf.
	DNSUpstream []netip.AddrPort
	// EgressPrivate is EgressPrivateDeny (the default when empty) or
	// EgressPrivateAllow. Either way an explicit policy may name private
	// addresses, and link-local and the host are never destinations.
	EgressPrivate string
	// NetPolicyHostNetNS is the path of the network namespace that plays
	// "host" for containment (veths, rules, NAT, resolvers); empty means
	// runnerd's own. For tests, so they never modify the real host.
	NetPolicyHostNetNS string

	// Isolate is IsolatePod, IsolateAll or IsolateNone (IsolateContained
	// is read as IsolateNone); empty means IsolatePod when runnerd runs as
	// root and can make pods, IsolateAll when it is root and cannot, else
	// IsolateNone.
	Isolate string
	// PodBinds are host paths bound into every pod (--bind), read-only
	// unless Writable; only with IsolatePod.
	PodBinds []pod.Bind
	// podsOff says why an empty Isolate became IsolateAll as root (pods
	// unavailable here); Run logs it.
	podsOff string
	// IdentityFirst and IdentityLast bound the uids given to isolated
	// sandboxes (gid = uid); both 0 means a range of 65,536 ids chosen for
	// the state directory and saved in it (claim.go), which no other live
	// runnerd on the host holds. The range must not hold 0, 65534, 65535 or
	// 4294967295, and should hold no uid or gid the host uses (one that
	// resolves through NSS is skipped).
	IdentityFirst, IdentityLast uint32
	// Cgroups is CgroupsAuto (the default when empty) or CgroupsOff: whether
	// every sandbox gets a cgroup (package cgroup) with its limits.
	Cgroups string
	// CgroupRoot is the cgroup under which sandboxes' cgroups go
	// (cgroup.Config.Root): relative to runnerd's own cgroup in each
	// hierarchy unless absolute. Empty means cgroup.DefaultRoot.
	CgroupRoot string
	// ClaimDir is where runnerd claims its identity range and cgroup root
	// against the other runnerds of the host (claim.go); empty means
	// DefaultClaimDir.
	ClaimDir string
	// DefaultLimits fill every field a sandbox's create leaves zero (and
	// apply to a create without limits), where limits are enforced.
	// Checked at start: a bad value fails Run.
	DefaultLimits wire.Limits

	// Storage is the storage driver of the sandboxes' disks: StorageDir
	// (the default when empty: no disk budgets), "btrfs", "ext4" or
	// StorageAuto (package storage; daemon/sandboxes/disk.go).
	// StorageSize is the btrfs pool file's size (0: DefaultStorageSize)
	// and DefaultDisk the disk_bytes of a sandbox created without one
	// where budgets are enforced (0 with a budget driver: none on btrfs,
	// refused on ext4, which needs a size).
	Storage     string
	StorageSize int64
	DefaultDisk int64

	// Version is reported by /healthz.
	Version string
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger

	// TCPListener, when set, is served instead of listening on Listen (for
	// tests and socket activation). Run closes it.
	TCPListener net.Listener
	// Ready, when set, is called once every listener is serving, with the
	// TCP address (empty if TCP is disabled).
	Ready func(tcpAddr string)
}

// DefaultStateDir resolves the state directory the way the docs say:
// $STATE_DIRECTORY (systemd), else $RUNNERD_STATE, else
// $XDG_STATE_HOME/runnerd, else, for root, RootStateDir (or
// ~/.local/state/runnerd where an older runnerd left its registry there),
// else ~/.local/state/runnerd.
func DefaultStateDir() (string, error) {
	if d := os.Getenv("STATE_DIRECTORY"); d != "" {
		// systemd may pass several, colon-separated; the first is ours.
		d, _, _ = strings.Cut(d, ":")
		return d, nil
	}
	if d := os.Getenv(EnvState); d != "" {
		return d, nil
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "runnerd"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil && os.Geteuid() != 0 {
		return "", fmt.Errorf("find state directory: %w", err)
	}
	legacy := filepath.Join(home, ".local", "state", "runnerd")
	if os.Geteuid() == 0 {
		// Root's home is 0700: an isolated sandbox's uid could not pass it
		// to reach its workspace under STATE/sandboxes.
		if _, err := os.Stat(filepath.Join(legacy, "registry.db")); home == "" || err != nil {
			return RootStateDir, nil
		}
	}
	return legacy, nil
}

// RootStateDir is the state directory of a root runnerd that is told none
// (systemd's StateDirectory=runnerd names the same): every directory
// above it is passable, as an isolated sandbox's way to its workspace
// needs.
const RootStateDir = "/var/lib/runnerd"

// withDefaults returns cfg with every unset field filled.
func (cfg Config) withDefaults() (Config, error) {
	for _, step := range []func() error{cfg.defaultPaths, cfg.defaultTuning, cfg.defaultIsolation, cfg.defaultLimits, cfg.checkListeners} {
		if err := step(); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// defaultPaths fills the state directory (made absolute), the listen
// address, the socket and the shim command.
func (cfg *Config) defaultPaths() error {
	if cfg.StateDir == "" {
		d, err := DefaultStateDir()
		if err != nil {
			return err
		}
		cfg.StateDir = d
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("resolve state directory: %w", err)
	}
	cfg.StateDir = abs
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(cfg.StateDir, "runnerd.sock")
	}
	if len(cfg.ShimCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find own executable for the shim: %w", err)
		}
		cfg.ShimCommand = []string{exe, "shim"}
	}
	return nil
}

// defaultTuning fills the pool, concurrency, grace and retention settings
// and the logger, and refuses negative bounds.
func (cfg *Config) defaultTuning() error {
	switch {
	case cfg.WarmShims == 0:
		cfg.WarmShims = DefaultWarmShims
	case cfg.WarmShims < 0:
		cfg.WarmShims = 0
	}
	if cfg.MaxExecs <= 0 {
		cfg.MaxExecs = DefaultMaxExecs
	}
	if cfg.TerminateGrace <= 0 {
		cfg.TerminateGrace = 5 * time.Second
	}
	if cfg.SuspendGrace <= 0 {
		cfg.SuspendGrace = 10 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.MaxSandboxSessions < 0 || cfg.MaxSandboxEndedSessions < 0 || cfg.SandboxJournalBytes < 0 {
		return errors.New("config: sessions and journal bytes per sandbox must not be negative")
	}
	if cfg.SessionRetention < 0 || cfg.JournalRetainBytes < 0 {
		return errors.New("config: session retention and journal retain bytes must not be negative")
	}
	if cfg.SessionRetention > 0 && cfg.JanitorInterval <= 0 {
		cfg.JanitorInterval = min(max(cfg.SessionRetention/10, time.Second), time.Minute)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

// defaultIsolation fills and checks network policy, private egress,
// isolation and the identity range.
func (cfg *Config) defaultIsolation() error {
	if err := oneOf("netpolicy", &cfg.NetPolicy, NetPolicyAuto, NetPolicyAuto, NetPolicyOff); err != nil {
		return err
	}
	if cfg.NetPolicyState != "" {
		abs, err := filepath.Abs(cfg.NetPolicyState)
		if err != nil {
			return fmt.Errorf("resolve netpolicy state directory: %w", err)
		}
		cfg.NetPolicyState = abs
	}
	if err := oneOf("egress private", &cfg.EgressPrivate, EgressPrivateDeny, EgressPrivateAllow, EgressPrivateDeny); err != nil {
		return err
	}
	switch cfg.Isolate {
	case "":
		cfg.Isolate = IsolateNone
		if os.Geteuid() == 0 {
			cfg.Isolate = IsolatePod
			if why := podsUnavailable(); why != "" {
				// Run logs why, so an operator who expected pods sees it.
				cfg.Isolate, cfg.podsOff = IsolateAll, why
			}
		}
	case IsolateContained:
		cfg.Isolate = IsolateNone
	case IsolateNone, IsolateAll:
	case IsolatePod:
		if os.Geteuid() != 0 {
			return fmt.Errorf("config: isolate %q needs runnerd to run as root (it maps each pod to ids of its own)", cfg.Isolate)
		}
		if why := podsUnavailable(); why != "" {
			return fmt.Errorf("config: isolate %q: %s", cfg.Isolate, why)
		}
	default:
		return fmt.Errorf("config: isolate %q: want %q, %q or %q", cfg.Isolate, IsolatePod, IsolateAll, IsolateNone)
	}
	if len(cfg.PodBinds) > 0 && cfg.Isolate != IsolatePod {
		return fmt.Errorf("config: --bind applies to pods (--isolate pod; here: %s)", cfg.Isolate)
	}
	if err := pod.CheckBinds(cfg.PodBinds); err != nil {
		return fmt.Errorf("config: --bind: %w", err)
	}
	for _, b := range cfg.PodBinds {
		if _, err := os.Lstat(b.Source); err != nil {
			return fmt.Errorf("config: --bind %s: %w", b.Source, err)
		}
	}
	if cfg.IdentityFirst != 0 || cfg.IdentityLast != 0 { // unset: chosen by claimHost
		if err := sandboxes.CheckIdentityRange(cfg.IdentityFirst, cfg.IdentityLast); err != nil {
			return err
		}
	}
	return nil
}

// oneOf sets an empty *v to def and refuses any value not in want,
// naming the setting and every value it takes.
func oneOf(name string, v *string, def string, want ...string) error {
	if *v == "" {
		*v = def
	}
	q := make([]string, len(want))
	for i, w := range want {
		if *v == w {
			return nil
		}
		q[i] = strconv.Quote(w)
	}
	return fmt.Errorf("config: %s %q: want %s or %s", name, *v, strings.Join(q[:len(q)-1], ", "), q[len(q)-1])
}

// podsUnavailable says why this runnerd cannot make pods ("" when it can).
func podsUnavailable() string {
	if !podjoin.Supported {
		return "runnerd was built without cgo (CGO_ENABLED=0): a session cannot join a pod"
	}
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		return fmt.Sprintf("user namespaces: %v", err)
	}
	if strings.TrimSpace(string(b)) == "0" {
		return "user namespaces are off (user.max_user_namespaces = 0)"
	}
	return ""
}

// defaultLimits fills the cgroups mode and checks the default limits
// against it.
func (cfg *Config) defaultLimits() error {
	if err := oneOf("cgroups", &cfg.Cgroups, CgroupsAuto, CgroupsAuto, CgroupsOff); err != nil {
		return err
	}
	if err := sandboxes.ToCgroupLimits(&cfg.DefaultLimits).Validate(); err != nil {
		return fmt.Errorf("config: default limits: %w", err)
	}
	if cfg.Cgroups == CgroupsOff && cfg.DefaultLimits != (wire.Limits{}) {
		return errors.New("config: default limits need cgroups (--cgroups=auto)")
	}
	if cfg.DefaultLimits.DiskBytes != 0 || cfg.DefaultLimits.DiskInodes != 0 {
		return errors.New("config: the default disk budget is DefaultDisk (--default-disk), not a default limit")
	}
	if err := oneOf("storage", &cfg.Storage, StorageDir, StorageAuto, storage.Btrfs, storage.Ext4, StorageDir); err != nil {
		return err
	}
	if cfg.StorageSize == 0 {
		cfg.StorageSize = DefaultStorageSize
	}
	if cfg.StorageSize < 128<<20 || cfg.DefaultDisk < 0 {
		return fmt.Errorf("config: storage size %d (want at least 128 MiB) and default disk %d (want 0 or more)", cfg.StorageSize, cfg.DefaultDisk)
	}
	return nil
}

// Storage drivers (Config.Storage).
const (
	// StorageDir keeps every sandbox's disk in a plain directory under
	// the state directory: no disk budget (disk_bytes is refused 501).
	// The default this release: a pool volume per sandbox changes where
	// workspaces live and what a create costs, measured before it becomes
	// the default (docs/operations.md, "Storage pool").
	StorageDir = storage.Dir
	// StorageAuto picks btrfs, else ext4, else dir, as the host has them
	// (storage.DefaultDriver), or the driver of the state directory's
	// existing pool; a pool it cannot open falls back to dir, logged.
	StorageAuto = sandboxes.StorageAuto
)

// DefaultStorageSize is the btrfs pool file's size (sparse: it takes
// what the volumes hold): every sandbox's disk together.
const DefaultStorageSize = storage.DefaultPoolSize

// DefaultDiskBytes is runnerd's --default-disk: 4 GiB, the disk budget
// of a sandbox created without one (as the journal budget, 4 GiB): room
// for a repository, its dependencies and a build, while a runaway writer
// stops there instead of at the state file system's end.
const DefaultDiskBytes = 4 << 30

// checkListeners checks the preview, metrics and TLS settings and that
// some API listener is left.
func (cfg *Config) checkListeners() error {
	if (cfg.PreviewListen == "") != (cfg.PreviewURLTemplate == "") {
		return errors.New("config: the preview listener needs both an address and a URL template")
	}
	if cfg.MetricsListen != "" {
		addr, err := metricsAddr(cfg.MetricsListen)
		if err != nil {
			return err
		}
		cfg.MetricsListen = addr
	}
	if err := cfg.checkTLSFiles(); err != nil {
		return err
	}
	if cfg.Listen == "none" && cfg.Socket == "none" && cfg.TCPListener == nil {
		return errors.New("config: both listeners disabled")
	}
	return nil
}

// Cgroup modes (Config.Cgroups).
const (
	// CgroupsAuto gives every sandbox a cgroup, and takes limits, when
	// this host can enforce them (cgroup.Manager.Available); otherwise
	// limits are refused with not_supported and the log says why.
	CgroupsAuto = "auto"
	// CgroupsOff never creates cgroups: resource_limits is not advertised
	// and limits are refused.
	CgroupsOff = "off"
)

// netPolicyState picks netpolicy's state directory: the configured one,
// else DefaultNetPolicyState when it can be created, else STATE/netpolicy.
func netPolicyState(cfg Config) string {
	if cfg.NetPolicyState != "" {
		return cfg.NetPolicyState
	}
	if err := os.MkdirAll(DefaultNetPolicyState, 0o700); err == nil {
		return DefaultNetPolicyState
	}
	return filepath.Join(cfg.StateDir, "netpolicy")
}

// DefaultDiskReserve is Config.DiskReserve when it is 0.
const DefaultDiskReserve = 8 << 20

// reserveFile is the registry's reserve under STATE.
const reserveFile = "registry.reserve"
