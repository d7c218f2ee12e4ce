package sessions

import (
	"context"
	"log/slog"
	"time"

	"github.com/agentrunner/runner/daemon/internal/life"
	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/daemon/sandboxes"
	"github.com/agentrunner/runner/journal"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/wire"
)

// Config is what the sessions manager needs of runnerd's configuration,
// normalized by the daemon (daemon.Config) before New.
type Config struct {
	StateDir string
	// Pool is the one way shims start (warm when one is idle, else cold).
	Pool *launch.Pool
	// MaxExecs bounds the execs in flight (--max-execs).
	MaxExecs int
	// MaxSandboxSessions and MaxSandboxEndedSessions bound one sandbox's
	// sessions whose shim may live, and the ended ones it keeps (0: no
	// bound).
	MaxSandboxSessions      int
	MaxSandboxEndedSessions int
	// SandboxJournalBytes is one sandbox's journal budget (0: none);
	// JournalRetainBytes what each journal retains.
	SandboxJournalBytes int64
	JournalRetainBytes  int64
	// SessionRetention is how long an ended session is kept (0: for
	// ever), looked at every JanitorInterval.
	SessionRetention time.Duration
	JanitorInterval  time.Duration
	// ShimStartTimeout bounds a spawn's shim start.
	ShimStartTimeout time.Duration
	// NetNSCheck reports whether pid runs in the network namespace at
	// path (netpolicy.ProcessInNetNS; tests replace it).
	NetNSCheck func(pid int, path string) (bool, error)
	// RequestID is the id of the API request ctx belongs to, or "", for
	// the log lines of what a request started.
	RequestID func(ctx context.Context) string
}

// ChunkSize is the read size of a plain stream's and an exec's body.
const ChunkSize = 64 << 10

// Metrics is what the manager reports to runnerd's metrics.
type Metrics interface {
	// SessionStarted counts a session whose command runs, ack after its
	// spawn began.
	SessionStarted(ack time.Duration)
	// SessionCollected counts an ended session the collector deleted.
	SessionCollected()
	// SessionEnded counts a session's end by its reason.
	SessionEnded(e *wire.Exit)
}

// Admission is told a session create's id before its record is
// committed, so capacity counts it once (daemon's admission).
type Admission interface {
	NameSession(ctx context.Context, sandbox, id string)
}

// Manager owns the sessions of one runnerd: spawn and exec, the journals
// and their readers, stdin gates, control (signal, resize, terminate,
// close-stdin), the per-sandbox bounds and the collector, listings, the
// records' repair from their shims, and the one way to start (Config.Pool)
// and reach (launch.DialFor with a launch.Budget) a shim. It asks the
// sandboxes manager for what a spawn needs (identity, cgroup leaf,
// network namespace, private binds), and is the sandboxes.Sessions that
// manager asks back: the import arrow runs sessions -> sandboxes only.
//
// Safe for concurrent use; the fields are set by New and read-only
// afterwards except where a field's comment says otherwise.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	reg     *registry.Registry
	sbx     *sandboxes.Manager
	life    *life.Life // runnerd's lifetime: work run later is tracked by it
	metrics Metrics
	adm     Admission
	watcher *journal.Watcher // wakes every follow reader (OpenReader); closed by Close
	execs   chan struct{}    // one token per exec in flight; cap is Config.MaxExecs
	stdin   stdinGates       // per-session bounds of stdin writes (stdingate.go)
	book    sessionBook      // per-sandbox session counts and the collector's queue (sessions_cap.go)
	// commits are the registry updates made after their answer; Close
	// closes it once the tracked work is done.
	commits *deferredCommits
	// exits are the exit watches: the manager records each session's
	// exit once, readers never do (exitwatch.go). Close ends them.
	exits exitWatches
}

var _ sandboxes.Sessions = (*Manager)(nil)

// New returns the sessions manager; its caller must Close it after the
// tracked work (lt.Wait) is done. It starts one inotify instance for
// every follow reader (the kernel allows 128 per user).
func New(cfg Config, log *slog.Logger, reg *registry.Registry, sbx *sandboxes.Manager, lt *life.Life, metrics Metrics, adm Admission) *Manager {
	return &Manager{
		cfg:     cfg,
		log:     log,
		reg:     reg,
		sbx:     sbx,
		life:    lt,
		metrics: metrics,
		adm:     adm,
		watcher: newWatcher(log),
		execs:   make(chan struct{}, cfg.MaxExecs),
		book:    newSessionBook(),
		commits: newDeferredCommits(reg, log),
	}
}

// Close ends the exit watches, closes the journal watcher, then lands the
// deferred registry commits. Call it once the tracked work is done (the
// handlers that follow a journal have ended), before the registry closes.
// Exits that happen after it are recorded at the next start (Reconcile).
func (s *Manager) Close() {
	s.exits.close()
	s.watcher.Close()
	s.commits.close()
}

// Watcher is the one inotify instance every follow reader shares.
func (s *Manager) Watcher() *journal.Watcher { return s.watcher }
