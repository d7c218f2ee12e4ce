package daemon

import (
	"os"
	"slices"
	"time"

	"github.com/agentrunner/runner/cgroup"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/daemon/sessions"
	"github.com/agentrunner/runner/netpolicy"
)

// What the managers get of Config: their parts of it (sandboxes, sessions),
// the shipped defaults of the bounds they enforce, and the variables
// tests replace (export_test.go, export_leaves_test.go).

// sandboxes is the sandboxes manager's part of cfg, which withDefaults
// and claimHost have settled.
func (cfg Config) sandboxes() sandboxes.Config {
	return sandboxes.Config{
		StateDir:           cfg.StateDir,
		IsolateAll:         cfg.Isolate == IsolateAll || cfg.Isolate == IsolatePod,
		Pods:               cfg.Isolate == IsolatePod,
		PodHolder:          append(slices.Clone(cfg.ShimCommand), "pod"), // the shim program's pod mode
		PodBinds:           cfg.PodBinds,
		IdentityFirst:      cfg.IdentityFirst,
		IdentityLast:       cfg.IdentityLast,
		EgressPrivate:      cfg.EgressPrivate == EgressPrivateAllow,
		TerminateGrace:     cfg.TerminateGrace,
		SuspendGrace:       cfg.SuspendGrace,
		Cgroups:            cfg.Cgroups != CgroupsOff,
		CgroupRoot:         cfg.CgroupRoot,
		DefaultLimits:      cfg.DefaultLimits,
		LeafSweepInterval:  leafSweepInterval,
		NetPolicy:          cfg.NetPolicy != NetPolicyOff,
		NetPolicyState:     cfg.NetPolicyState, // claimNet settled it (netPolicyState)
		NetTable:           cfg.netTable,
		NetPolicyPool:      cfg.NetPolicyPool,
		DNSUpstream:        cfg.DNSUpstream,
		NetPolicyHostNetNS: cfg.NetPolicyHostNetNS,
		Storage:            cfg.Storage,
		StorageSize:        cfg.StorageSize,
		DefaultDisk:        cfg.DefaultDisk,
	}
}

// leafSweepInterval is how often runnerd looks for session leaves whose
// session has ended and which hold no process any more (a variable for
// tests: SetLeafSweepInterval).
var leafSweepInterval = 5 * time.Second

// The shipped defaults: what runnerd's flags (--default-pids,
// --default-memory; the session bounds are in sessions_cap.go) give when
// an operator names none, chosen so that a host running a few dozen sandboxes (the design
// point: 2 cores, 24 GiB, pid_max 32768) survives any one of them
// misbehaving (docs/cgroups.md, "Default limits"). Config's zero values
// are no bound: the defaults are runnerd's, not the library's.
const (
	// DefaultSandboxPids bounds a sandbox's tasks (processes and
	// threads): a parallel build or a language server pool stays in the
	// low hundreds, a fork bomb stops here, and 24 sandboxes at the bound
	// together still leave a 32768 pid_max room for the host.
	DefaultSandboxPids = 1024
	// DefaultSandboxMemoryShare is the share of the host's memory
	// (MemTotal) one sandbox may use: 1/8, 3 GiB on a 24 GiB host,
	// enough for a compiler or a test suite, and a runaway takes at most
	// an eighth of the host, its own OOM kill, never runnerd's.
	DefaultSandboxMemoryShare = 8
)

// DefaultSandboxMemory is the shipped default memory limit: the host's
// MemTotal divided by DefaultSandboxMemoryShare, in whole pages, at
// least cgroup.MinMemoryBytes.
func DefaultSandboxMemory() (int64, error) {
	total, err := sandboxes.Meminfo("MemTotal:")
	if err != nil {
		return 0, err
	}
	page := int64(os.Getpagesize())
	return max(total/DefaultSandboxMemoryShare/page*page, cgroup.MinMemoryBytes), nil
}

// The shipped defaults of the two bounds (runnerd's --sandbox-max-sessions
// and --sandbox-max-ended-sessions); docs/cgroups.md, "Default limits".
const (
	// DefaultSandboxSessions bounds the sessions of one sandbox whose
	// shim may live (running, or ended with processes left): each shim
	// costs 2-4 MiB charged to runnerd's unit, so 256 keep one sandbox's
	// shims near 1 GiB at worst, far above what an agent runs at once.
	DefaultSandboxSessions = 256
	// DefaultSandboxEndedSessions bounds the ended sessions one sandbox
	// keeps before the oldest are collected: each costs a registry record,
	// a directory of about a dozen inodes and its journal. 1024 keeps a
	// day or more of an agent's commands readable, and 24 sandboxes at the
	// bound hold about 25,000 directories, which any state disk takes.
	DefaultSandboxEndedSessions = 1024
)

// shimStartTimeout bounds a spawn's shim start (a variable for tests).
var shimStartTimeout = 30 * time.Second

// netNSCheck is the check verifyNetNS makes (a variable for tests, which
// replace it with one that answers as the kernel does for a command that
// has just ended).
var netNSCheck = netpolicy.ProcessInNetNS

// DefaultSandboxJournalBytes is runnerd's --sandbox-journal-bytes: 4 GiB
// of output per sandbox (its sessions' journals together): days of an
// agent's turns, and a few dozen sandboxes at their cap still fit a
// modest state disk, which the disk-full handling protects beyond that.
const DefaultSandboxJournalBytes = 4 << 30

// sessions is the sessions manager's part of cfg, which withDefaults and
// openState have settled.
func (cfg Config) sessions() sessions.Config {
	return sessions.Config{
		StateDir:                cfg.StateDir,
		Pool:                    cfg.pool,
		MaxExecs:                cfg.MaxExecs,
		MaxSandboxSessions:      cfg.MaxSandboxSessions,
		MaxSandboxEndedSessions: cfg.MaxSandboxEndedSessions,
		SandboxJournalBytes:     cfg.SandboxJournalBytes,
		JournalRetainBytes:      cfg.JournalRetainBytes,
		SessionRetention:        cfg.SessionRetention,
		JanitorInterval:         cfg.JanitorInterval,
		ShimStartTimeout:        shimStartTimeout,
		// Read at each check, not now: a test replaces it while a daemon
		// runs (SetNetNSCheck).
		NetNSCheck: func(pid int, path string) (bool, error) { return netNSCheck(pid, path) },
		RequestID:  requestID,
	}
}
