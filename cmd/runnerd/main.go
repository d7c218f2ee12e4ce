// Command runnerd is the runner daemon: it serves the HTTP+WebSocket API of
// docs/protocol.md and runs each session under a detached shim. This file is
// wiring only: flags and environment into daemon.Config, then daemon.Run.
//
// "runnerd shim ..." is the hidden per-session supervisor (shim.Main):
// without --shim runnerd re-executes itself that way, so one binary is the
// whole install; with --shim it starts "runner-shim serve" instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/pod"
	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/version"
	"github.com/agentrunner/runner/wire"
)

const usage = `runnerd: the runner daemon (docs/protocol.md, docs/operations.md)

Usage: runnerd [flags]

With no flags runnerd serves on 127.0.0.1:7323 and STATE/runnerd.sock, keeps
its state in the first of $STATE_DIRECTORY, $RUNNERD_STATE,
$XDG_STATE_HOME/runnerd, ~/.local/state/runnerd (as root: /var/lib/runnerd,
unless an older runnerd's registry is in ~/.local/state/runnerd), and
generates its bearer token into STATE/token (mode 0600) on first start. As
root every sandbox is a pod (--isolate pod; --isolate all where pods cannot
be made) unless --isolate none.

Flags:
`

const envHelp = `
Environment:
  STATE_DIRECTORY    set by systemd's StateDirectory=: the state directory
  RUNNERD_STATE      state directory when $STATE_DIRECTORY is unset (--state wins
                     over both)
  RUNNERD_LISTEN     TCP address, or "none" (flag --listen wins)
  RUNNERD_SOCKET     unix socket path, or "none" (flag --socket wins)
  RUNNERD_TOKEN      bearer token; overrides STATE/token (never pass it as a flag:
                     flags are visible in ps)
  RUNNERD_TLS_CERT, RUNNERD_TLS_KEY, RUNNERD_TLS_CLIENT_CA
                     TLS of the TCP listeners (flags --tls-cert, --tls-key,
                     --tls-client-ca); without them a non-loopback --listen is
                     refused unless RUNNERD_INSECURE_LISTEN=1 (--insecure-listen)
  RUNNERD_PREVIEW_LISTEN, RUNNERD_PREVIEW_URL
                     the preview listener (flags --preview-listen, --preview-url);
                     set both to advertise public_url
  RUNNERD_NETPOLICY, RUNNERD_NETPOLICY_STATE
                     network containment (flags --netpolicy, --netpolicy-state)
  RUNNERD_ISOLATE, RUNNERD_IDENTITY_RANGE
                     isolation (flags --isolate, --identity-range)
  RUNNERD_METRICS_LISTEN
                     the token-free metrics listener (flag --metrics-listen wins)
  RUNNERD_SHIM       the runner-shim binary (flag --shim wins)
  RUNNERD_LOG_LEVEL  debug, info, warn, error (flag --log-level wins)
  NOTIFY_SOCKET      set by systemd (Type=notify): runnerd reports READY=1 there

Signals: SIGTERM and SIGINT stop serving gracefully. Running sessions are never
stopped: each runs under its own detached shim and is found again at the next start.
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		os.Exit(shim.Main(os.Args[2:], shim.Hooks{}))
	}
	// Whatever runnerd inherited beyond stdin, stdout and stderr (a
	// shell's pipe, a supervisor's socket; runnerd takes no descriptor by
	// socket activation) is not for the shims nor their commands: marked
	// close-on-exec before anything is started.
	if err := shim.MarkCloseOnExec(); err != nil {
		fmt.Fprintln(os.Stderr, "runnerd: mark inherited descriptors close-on-exec:", err)
		os.Exit(1)
	}
	os.Exit(run(os.Args[1:]))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func run(args []string) int {
	fs := flag.NewFlagSet("runnerd", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), envHelp)
	}
	state := fs.String("state", "", "state directory (default: see above)")
	listen := fs.String("listen", envOr(daemon.EnvListen, daemon.DefaultListen), `TCP address to serve on, or "none"`)
	socket := fs.String("socket", envOr(daemon.EnvSocket, ""), `unix socket to serve on, or "none" (default STATE/runnerd.sock)`)
	metricsListen := fs.String("metrics-listen", envOr(daemon.EnvMetricsListen, ""), `also serve GET /metrics (and /healthz) here, without the token, for a scraper; a bare port ("9323") is on loopback; empty: none (/metrics stays on the API listeners, with the token)`)
	previewListen := fs.String("preview-listen", envOr(daemon.EnvPreviewListen, ""), "address of the preview listener (public URLs); empty: none")
	tlsCert := fs.String("tls-cert", envOr("RUNNERD_TLS_CERT", ""), "PEM certificate of the TCP listeners (API and preview): they speak TLS 1.2+; re-read when the file changes")
	tlsKey := fs.String("tls-key", envOr("RUNNERD_TLS_KEY", ""), "PEM key of --tls-cert")
	tlsClientCA := fs.String("tls-client-ca", envOr("RUNNERD_TLS_CLIENT_CA", ""), "PEM CA(s) whose client certificates the API listener requires (mTLS); the bearer token is still required")
	insecureListen := fs.Bool("insecure-listen", os.Getenv("RUNNERD_INSECURE_LISTEN") == "1", "allow plain HTTP on a non-loopback address (refused otherwise; warned at every start): the token crosses the network in clear")
	previewURL := fs.String("preview-url", envOr(daemon.EnvPreviewURL, ""), `preview URL template, e.g. "http://{token}.localhost:7324/"`)
	netPolicy := fs.String("netpolicy", envOr(daemon.EnvNetPolicy, daemon.NetPolicyAuto),
		`network containment: "auto" enforces network policies (and advertises network_policy) when the host can (root, netns, nf_tables), and logs why not otherwise; "off" never does`)
	netState := fs.String("netpolicy-state", envOr(daemon.EnvNetPolicyState, ""),
		"network containment's state directory (default "+daemon.DefaultNetPolicyState+", or STATE/netpolicy if /run is not writable)")
	netPool := fs.String("netpolicy-pool", "", "IPv4 pool for contained sandboxes, one /30 each (default 10.213.0.0/16); must not overlap a network the host uses")
	var binds podBinds
	fs.Var(&binds, "bind", "SOURCE:TARGET[:ro|rw]: a host path bound at TARGET in every pod (--isolate pod), read-only unless rw (the kernel holds it); repeatable")
	var upstreams addrPorts
	fs.Var(&upstreams, "dns-upstream", "DNS server (IP or IP:port) the sandboxes' resolvers forward allowed names to; repeatable (default: the nameservers of /etc/resolv.conf)")
	egressPrivate := fs.String("egress-private", envOr("RUNNERD_EGRESS_PRIVATE", daemon.EgressPrivateDeny),
		`whether the open egress of a sandbox created without a network policy reaches private networks (10/8, 172.16/12, 192.168/16, 100.64/10): "deny" (the default) or "allow"; a policy may name them either way; link-local (169.254/16, cloud metadata) and the host never are`)
	hostNetNS := fs.String("netpolicy-host-netns", "", "TESTING: network namespace file that plays the host for containment (veths, rules, resolvers), so tests never change the real host's network; empty: runnerd's own")
	isolate := fs.String("isolate", envOr(daemon.EnvIsolate, ""),
		`"pod" (the default as root where user namespaces are on and runnerd was built with cgo): every sandbox is a pod, root inside a user namespace mapped to 65,536 unprivileged ids of its own, with its own processes, overlay root over the host's system directories and the workspace at /workspace, in a network namespace of its own; "all" (the default as root otherwise, logged at start): every sandbox runs as an unprivileged uid of its own with no way back to privilege, in a network namespace of its own (open egress, never the host, unless a policy narrows it); "none" (the default when not root; "contained" is its old name): a sandbox without a network policy runs as its user or as runnerd's, on the host network, and so can do whatever that user can (as root: read runnerd's token, signal any process, write the host) — only for a VM that is itself the boundary`)
	identityRange := fs.String("identity-range", envOr(daemon.EnvIdentityRange, ""),
		"FIRST-LAST: the uids (gid = uid) given to isolated sandboxes; must hold no uid or gid the host uses and overlap no other runnerd's (default: 65,536 ids chosen for the state directory in a range systemd documents as unused, saved in it, held by no other live runnerd)")
	claimDir := fs.String("claim-dir", "", "directory where runnerd claims its identity range and cgroup root against the host's other runnerds (default "+daemon.DefaultClaimDir+", or $TMPDIR/runnerd-UID/claims when not root)")
	cgroups := fs.String("cgroups", envOr("RUNNERD_CGROUPS", daemon.CgroupsAuto),
		`per-sandbox cgroups with resource limits: "auto" (when this host can enforce them: root or a delegated subtree with the memory, pids and cpu controllers; resource_limits is advertised) or "off" (never; limits are refused with not_supported)`)
	cgroupRoot := fs.String("cgroup-root", "", "cgroup under which sandboxes' cgroups go, relative to runnerd's own cgroup in each hierarchy unless absolute (default \"runner\")")
	// The shipped defaults bound every new sandbox where cgroups enforce
	// them (docs/cgroups.md, "Default limits"); 0 turns one off.
	shippedMemory, memErr := daemon.DefaultSandboxMemory()
	defMemory := byteSize(shippedMemory)
	fs.Var(&defMemory, "default-memory", fmt.Sprintf("memory limit of a sandbox created without one, in bytes or with a K, M or G suffix (powers of 1024); default 1/%d of this host's memory; 0: none", daemon.DefaultSandboxMemoryShare))
	defPids := fs.Int64("default-pids", daemon.DefaultSandboxPids, "tasks (processes and threads) limit of a sandbox created without one; 0: none")
	sandboxSessions := fs.Int("sandbox-max-sessions", daemon.DefaultSandboxSessions, "most sessions of one sandbox that hold a supervisor (2-4 MiB of runnerd's memory each): running, or ended with processes left; one more is answered 409 invalid (detail session_cap); 0: no bound")
	sandboxEnded := fs.Int("sandbox-max-ended-sessions", daemon.DefaultSandboxEndedSessions, "most ended sessions one sandbox keeps (record, directory, journal); past it the oldest are deleted as DELETE .../sessions/{id} does, so read what you need of a session before this many more have ended; never refused; 0: keep until deleted")
	sandboxJournal := byteSize(daemon.DefaultSandboxJournalBytes)
	fs.Var(&sandboxJournal, "sandbox-journal-bytes", "most bytes the journals of one sandbox's sessions hold together, running or ended until deleted, with a K, M or G suffix (powers of 1024): output past it ends its session (the exit names the cap) and a create is answered 409 invalid (detail journal_cap); 0: no bound")
	defWeight := fs.Uint64("default-cpu-weight", 0, "CPU weight (1..10000, kernel default 100) of a sandbox created without one; 0: the kernel's default")
	defQuota := fs.Int64("default-cpu-quota-us", 0, "CPU time in microseconds per --default-cpu-period-us a sandbox created without a quota may use (200000 per 100000 is two cores); 0: none")
	defPeriod := fs.Int64("default-cpu-period-us", 0, "accounting period of --default-cpu-quota-us (1000..1000000; 0: 100000)")
	storageDriver := fs.String("storage", envOr("RUNNERD_STORAGE", daemon.StorageDir),
		`storage driver of the sandboxes' disks (docs/operations.md, "Storage pool"): "dir" (the default this release: plain directories, no disk budget; disk_bytes is refused), "btrfs" (one pool file on a loop device, a subvolume and quota per sandbox; no inode budget), "ext4" (an image file and loop device per sandbox; bytes and inodes), or "auto" (btrfs, else ext4, else dir, as this host has them; a state directory's existing pool keeps its driver)`)
	storageSize := byteSize(daemon.DefaultStorageSize)
	fs.Var(&storageSize, "storage-size", "size of the btrfs pool file (STATE/storage/pool.img, sparse), with a K, M or G suffix (powers of 1024), at least 128M: every sandbox's disk together; a larger size grows an existing pool, a smaller one leaves it")
	defDisk := byteSize(daemon.DefaultDiskBytes)
	fs.Var(&defDisk, "default-disk", "disk budget (disk_bytes) of a sandbox created without one, with a K, M or G suffix (powers of 1024), where budgets are enforced (--storage btrfs, ext4, or auto finding one); 0: none on btrfs (ext4 needs one)")
	shimBin := fs.String("shim", envOr("RUNNERD_SHIM", ""), `the per-session supervisor binary (runner-shim, run as "PATH serve"), built from the same source as this runnerd; empty: runnerd re-executes itself as "runnerd shim" (one binary, ~0.4 MiB more private memory per idle session)`)
	diskReserve := fs.Int64("disk-reserve", daemon.DefaultDiskReserve, "bytes set aside on the state file system for the registry commits of terminate, delete, suspend and destroy on a full disk")
	warmShims := fs.Int("warm-shims", daemon.DefaultWarmShims, "pre-started shims kept waiting for a session, so a spawn skips two process starts (~1.5 MiB private memory each while idle); 0 disables")
	maxExecs := fs.Int("max-execs", daemon.DefaultMaxExecs, "execs in flight at once (each buffers up to 2x16 MiB of output); one more is answered 429 rate_limited")
	maxSandboxes := fs.Int("max-sandboxes", 0, "most sandboxes this host holds; a create of one more is answered 503 unavailable with exhausted set (GET /v1/capacity reports it); 0: no bound")
	maxSessions := fs.Int("max-sessions", 0, "most sessions running at once on this host; a spawn of one more is answered 503 unavailable with exhausted set; 0: no bound")
	retention := fs.Duration("session-retention", 0, "delete an ended session (record, directory, journal) this long after its exit, as DELETE .../sessions/{id} does; a control plane must persist what it needs before then; 0 keeps sessions until their sandbox is destroyed")
	retainBytes := fs.Int64("journal-retain-bytes", 0, "cap each stream's journal of new sessions at about N bytes (plus one 64 MiB segment): the oldest whole segments are dropped, and a reader behind them is answered 416 truncated; 0 keeps everything")
	logLevel := fs.String("log-level", envOr("RUNNERD_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	logJSON := fs.Bool("log-json", false, "log JSON lines instead of text")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "runnerd: unexpected argument %q (see runnerd --help)\n", fs.Arg(0))
		return 2
	}
	if *showVersion {
		fmt.Println(version.String())
		return 0
	}
	if memErr != nil && !flagSet(fs, "default-memory") {
		fmt.Fprintf(os.Stderr, "runnerd: the default memory limit (1/%d of the host's memory): %v; name one with --default-memory (0: none)\n", daemon.DefaultSandboxMemoryShare, memErr)
		return 2
	}
	if *cgroups == daemon.CgroupsOff {
		// Without cgroups no limit is enforced, so none is claimed: the
		// shipped defaults go; defaults an operator named are refused by
		// daemon.Run, as before.
		if !flagSet(fs, "default-memory") {
			defMemory = 0
		}
		if !flagSet(fs, "default-pids") {
			*defPids = 0
		}
	}
	if *sandboxSessions < 0 {
		fmt.Fprintf(os.Stderr, "runnerd: --sandbox-max-sessions %d: want 0 or more\n", *sandboxSessions)
		return 2
	}
	if *sandboxEnded < 0 {
		fmt.Fprintf(os.Stderr, "runnerd: --sandbox-max-ended-sessions %d: want 0 or more\n", *sandboxEnded)
		return 2
	}
	var pool netip.Prefix
	if *netPool != "" {
		p, err := netip.ParsePrefix(*netPool)
		if err != nil {
			fmt.Fprintf(os.Stderr, "runnerd: --netpolicy-pool %q: %v\n", *netPool, err)
			return 2
		}
		pool = p
	}
	var idFirst, idLast uint32
	if *identityRange != "" {
		var err error
		idFirst, idLast, err = daemon.ParseIdentityRange(*identityRange)
		if err != nil {
			fmt.Fprintf(os.Stderr, "runnerd: --identity-range: %v\n", err)
			return 2
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(strings.ToUpper(*logLevel))); err != nil {
		fmt.Fprintf(os.Stderr, "runnerd: --log-level %q: %v\n", *logLevel, err)
		return 2
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if *logJSON {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	log := slog.New(h)

	var shimCommand []string
	if *shimBin != "" {
		shimCommand = []string{*shimBin, "serve"}
	}
	if *warmShims < 0 {
		fmt.Fprintf(os.Stderr, "runnerd: --warm-shims %d: want 0 or more\n", *warmShims)
		return 2
	}
	if *warmShims == 0 {
		*warmShims = -1 // Config: negative disables, 0 is the default
	}
	if *maxExecs < 1 {
		fmt.Fprintf(os.Stderr, "runnerd: --max-execs %d: want 1 or more\n", *maxExecs)
		return 2
	}
	cfg := daemon.Config{
		MaxExecs:            *maxExecs,
		Capacity:            daemon.CapacityLimits{MaxSandboxes: *maxSandboxes, MaxSessions: *maxSessions},
		MaxSandboxSessions:  *sandboxSessions,
		SandboxJournalBytes: int64(sandboxJournal),
		ShimCommand:         shimCommand,
		WarmShims:           *warmShims,
		DiskReserve:         *diskReserve,
		StateDir:            *state, // "": daemon.DefaultStateDir
		Listen:              *listen,
		Socket:              *socket,
		Token:               os.Getenv(daemon.EnvToken),
		Version:             version.String(),

		MetricsListen:      *metricsListen,
		PreviewListen:      *previewListen,
		PreviewURLTemplate: *previewURL,

		TLSCert:        *tlsCert,
		TLSKey:         *tlsKey,
		TLSClientCA:    *tlsClientCA,
		InsecureListen: *insecureListen,

		NetPolicy:          *netPolicy,
		NetPolicyState:     *netState,
		NetPolicyPool:      pool,
		DNSUpstream:        upstreams,
		EgressPrivate:      *egressPrivate,
		NetPolicyHostNetNS: *hostNetNS,

		Isolate:       *isolate,
		PodBinds:      binds,
		IdentityFirst: idFirst,
		IdentityLast:  idLast,
		ClaimDir:      *claimDir,

		Storage:     *storageDriver,
		StorageSize: int64(storageSize),
		DefaultDisk: int64(defDisk),

		Cgroups:    *cgroups,
		CgroupRoot: *cgroupRoot,
		DefaultLimits: wire.Limits{MemoryBytes: int64(defMemory), Pids: *defPids, CPUWeight: *defWeight,
			CPUQuotaUS: *defQuota, CPUPeriodUS: *defPeriod},

		SessionRetention:   *retention,
		JournalRetainBytes: *retainBytes,

		MaxSandboxEndedSessions: *sandboxEnded,

		Logger: log,
	}
	if *retention < 0 || *retainBytes < 0 {
		fmt.Fprintln(os.Stderr, "runnerd: --session-retention and --journal-retain-bytes: want 0 or more")
		return 2
	}
	// A log line written after stderr's reader went away (runnerd 2>&1 |
	// tee log, then Ctrl-C, which ends tee too) fails with EPIPE instead
	// of killing runnerd half-way through its stop (stale socket and
	// listen.json). Notify, not Ignore: an ignored SIGPIPE would be
	// inherited by the shims and the commands they start.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := daemon.Run(ctx, cfg); err != nil {
		log.Error("runnerd", "err", err)
		return 1
	}
	return 0
}

// addrPorts is a repeatable flag of DNS servers: "IP" (port 53) or
// "IP:port".
// podBinds is --bind, repeatable.
type podBinds []pod.Bind

func (b *podBinds) String() string {
	var parts []string
	for _, x := range *b {
		parts = append(parts, x.Source+":"+x.Target)
	}
	return strings.Join(parts, ",")
}

func (b *podBinds) Set(v string) error {
	x, err := daemon.ParseBind(v)
	if err != nil {
		return err
	}
	*b = append(*b, x)
	return nil
}

type addrPorts []netip.AddrPort

func (a *addrPorts) String() string {
	var parts []string
	for _, ap := range *a {
		parts = append(parts, ap.String())
	}
	return strings.Join(parts, ",")
}

func (a *addrPorts) Set(v string) error {
	if ip, err := netip.ParseAddr(v); err == nil {
		*a = append(*a, netip.AddrPortFrom(ip, 53))
		return nil
	}
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		return fmt.Errorf("want IP or IP:port: %w", err)
	}
	*a = append(*a, ap)
	return nil
}

// byteSize is a flag of bytes: a number with an optional K, M or G suffix
// (powers of 1024; "KiB" and "k" spell the same).
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(v string) error {
	s := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(v)), "B"), "I")
	shift := 0
	switch {
	case strings.HasSuffix(s, "K"):
		shift = 10
	case strings.HasSuffix(s, "M"):
		shift = 20
	case strings.HasSuffix(s, "G"):
		shift = 30
	}
	if shift > 0 {
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)>>shift {
		return fmt.Errorf("%q: want bytes, optionally with a K, M or G suffix", v)
	}
	*b = byteSize(n << shift)
	return nil
}

// flagSet reports whether the command line named flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
