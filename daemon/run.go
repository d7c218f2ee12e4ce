package daemon

// Run and its named start steps: the state directory, the registry, the
// host claim, recovery, the collector, janitor and network. What runnerd
// listens on and serves is in listeners.go, the shim check in shimcheck.go.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentrunner/runner/daemon/registry"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/wire"
)

// Run serves runnerd until ctx ends, then stops serving gracefully: it
// stops accepting, closes attaches (clients reattach from their cursors),
// waits up to cfg.ShutdownTimeout for in-flight requests, and closes the
// registry. It never stops a session: shims are detached and outlive it.
//
// Run fails at once if another runnerd holds the state directory.
//
// Run is wiring: each step below owns what it starts and hands back its
// stop, deferred here, so the defers run in the reverse of the order the
// steps started (the comments say where that order matters).
func Run(ctx context.Context, cfg Config) (err error) {
	if l := cfg.TCPListener; l != nil {
		// Run owns it: a failure before serving must not leave it
		// accepting connections nobody answers.
		defer func() {
			if err != nil {
				l.Close()
			}
		}()
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		return err
	}
	log := cfg.Logger
	if cfg.podsOff != "" {
		log.Warn("sandboxes are not pods (isolated by uid instead, --isolate all)", "why", cfg.podsOff)
	}
	if err := prepareStateDir(cfg); err != nil {
		return err
	}
	// From here until listen.json is written, a client finds runnerd
	// starting, not stopped (wire.StartingFile).
	startingPath := filepath.Join(cfg.StateDir, wire.StartingFile)
	if err := writeStarting(startingPath); err != nil {
		log.Warn("cannot say runnerd is starting", "err", err)
	}
	defer removeStarting(startingPath)
	if err := checkShim(ctx, cfg.ShimCommand, cfg.Version, log); err != nil {
		return err
	}

	// Open state.
	token, reg, closeState, err := openState(&cfg)
	if err != nil {
		return err
	}
	defer closeState()

	// Claim the host: before anything touches identities or cgroups,
	// another runnerd on the host must not hold the same ones (claim.go).
	hc, err := claimHostFor(&cfg, reg)
	if err != nil {
		return err
	}
	defer hc.release()

	// Start the subsystems.
	s, stopSubsystems, err := startSubsystems(ctx, cfg, reg, token)
	if err != nil {
		return err
	}
	defer stopSubsystems()

	// Listeners.
	ls, stopListeners, err := s.startListeners()
	if err != nil {
		return err
	}
	defer stopListeners()
	listenPath := filepath.Join(cfg.StateDir, wire.ListenFile)
	if err := writeListen(listenPath, ls.listen(cfg)); err != nil {
		ls.close()
		return err
	}
	// Removed only at a clean stop: the registry lock proves the file is
	// this daemon's.
	defer os.Remove(listenPath)
	removeStarting(startingPath) // serving now: listen.json says where

	// Serve, then stop.
	return s.serve(ctx, ls)
}

// openState loads the token, opens the registry and starts the warm
// shim pool (cfg.pool). closeState closes the pool, then the registry.
func openState(cfg *Config) (token string, reg *registry.Registry, closeState func(), err error) {
	token, err = loadToken(cfg.StateDir, cfg.Token)
	if err != nil {
		return "", nil, nil, err
	}
	reg, err = openRegistry(*cfg)
	if err != nil {
		return "", nil, nil, err
	}
	// The one way shims start (warm when one is idle, else cold; with
	// --warm-shims 0 always cold). Closed after the listeners and
	// in-flight requests are done (closeState runs late): idle warm shims
	// exit, taken ones are sessions and keep running.
	pool := launch.NewPool(cfg.ShimCommand, launch.PoolOptions{Size: cfg.WarmShims,
		Root: filepath.Join(cfg.StateDir, "s"), RetainBytes: cfg.JournalRetainBytes})
	cfg.pool = pool
	closeState = func() {
		pool.Close()
		reg.Close()
	}
	return token, reg, closeState, nil
}

// startSubsystems makes the server and starts what runs beside its
// handlers, in order: its life, the deferred commits, the inotify
// watcher, recovery, cgroups, the collector, the janitor and network
// policy. stop stops them in the reverse order; on an error,
// startSubsystems has stopped what it started.
func startSubsystems(ctx context.Context, cfg Config, reg *registry.Registry, token string) (s *server, stop func(), err error) {
	var stops []func() // run last to first, as defers
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stopAll()
		}
	}()
	s = newServer(cfg, reg)
	stops = append(stops, s.life.End) // BeginStop ends it on a clean stop; this on an early return
	// The sessions manager's journal watcher closes, then its deferred
	// registry commits land, after the tracked handlers end (stops run
	// after s.life.Wait in serve) and before the registry closes.
	stops = append(stops, s.ssn.Close)
	if err := s.sbx.InitIdentities(); err != nil { // identities, and the state directory's modes
		return nil, nil, err
	}
	// The pool's volumes are mounted before any session or request can
	// use a workspace on them (disk.go).
	if err := s.sbx.StartStorage(ctx); err != nil {
		return nil, nil, err
	}
	stops = append(stops, s.sbx.CloseStorage, s.sbx.ReleasePods) // pods keep running, as sessions do
	s.token = token
	s.routes()
	if err := s.recoverState(ctx); err != nil {
		return nil, nil, err
	}
	stops = append(stops, s.sbx.StartCgroups()) // limits.go; adopts the sandboxes' cgroups in the background
	stops = append(stops, s.startCollector(), s.startJanitor(), s.startNetwork(ctx))
	return s, stopAll, nil
}

// prepareStateDir raises the descriptor limit and creates the state
// directory with the modes a sandbox's uid needs to pass through it.
func prepareStateDir(cfg Config) error {
	log := cfg.Logger
	// Thousands of sessions hold a descriptor each for every connection,
	// journal reader and shim socket: take all the kernel allows.
	if lim, err := raiseNoFile(); err != nil {
		log.Warn("cannot raise the descriptor limit", "err", err, "soft", lim.Cur, "hard", lim.Max)
	} else {
		log.Info("descriptor limit", "soft", lim.Cur, "hard", lim.Max)
	}
	// The directories above the state directory that runnerd creates hold
	// nothing of its own: 0755, so an isolated sandbox's uid can pass them
	// on its way to its workspace (MkdirAll with 0700 made ~/.local/state
	// a dead end).
	if err := os.MkdirAll(filepath.Dir(cfg.StateDir), 0o755); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "sandboxes"), filepath.Join(cfg.StateDir, "s")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create state directory: %w", err)
		}
	}
	// The state directory holds the token, the control sockets of shims and
	// journals: only its owner may enter. Workspaces sit below it; a
	// sandbox user reaches its own through the (0755) sandboxes directory
	// only if the state directory lets it, so keep 0711 there.
	if err := os.Chmod(cfg.StateDir, 0o711); err != nil {
		return fmt.Errorf("chmod state directory: %w", err)
	}
	os.Chmod(filepath.Join(cfg.StateDir, "sandboxes"), 0o711)
	return nil
}

// openRegistry opens the registry and sets its disk reserve; the caller
// closes it.
func openRegistry(cfg Config) (*registry.Registry, error) {
	reg, err := registry.Open(filepath.Join(cfg.StateDir, "registry.db"))
	if err != nil {
		return nil, fmt.Errorf("%w (is another runnerd using %s?)", err, cfg.StateDir)
	}
	if err := reg.SetReserve(filepath.Join(cfg.StateDir, reserveFile), cfg.DiskReserve); err != nil {
		reg.Close()
		return nil, err
	}
	return reg, nil
}

// claimHostFor claims cfg's identity range and cgroup root (claim.go); the
// caller releases the claim.
func claimHostFor(cfg *Config, reg *registry.Registry) (*hostClaim, error) {
	ids, err := reg.Identities()
	if err != nil {
		return nil, fmt.Errorf("read registry: %w", err)
	}
	hc, err := claimHost(cfg, len(ids) > 0)
	if err != nil {
		return nil, err
	}
	cfg.Logger.Info("identity range and cgroup root claimed", "identity_range", fmt.Sprintf("%d-%d", cfg.IdentityFirst, cfg.IdentityLast), "cgroup_root", cfg.CgroupRoot)
	return hc, nil
}

// recoverState brings the checkpoints and sessions of the last run back
// before any disk is used or any request is served.
func (s *server) recoverState(ctx context.Context) error {
	if err := s.sbx.RecoverCheckpoints(); err != nil { // checkpoints.go: before any disk is used
		return fmt.Errorf("recover checkpoints: %w", err)
	}
	s.sbx.RecoverForks(ctx) // fork.go: a half-made fork is removed before any request
	if err := s.ssn.Reconcile(ctx); err != nil {
		return fmt.Errorf("recover sessions: %w", err)
	}
	return nil
}

// startCollector starts the ended-session collector (sessions_cap.go) when
// a cap is set. It ends when Run begins stopping (s.life); stop ends it on
// an early return too and waits for it.
func (s *server) startCollector() (stop func()) {
	if s.cfg.MaxSandboxEndedSessions <= 0 {
		return func() {}
	}
	return s.goUntilStop(s.ssn.Collector)
}

// startJanitor starts the retention janitor (recovery.go) when a retention
// is set. It ends when Run begins stopping (s.life) and is waited for
// before the registry closes (defers run in reverse).
func (s *server) startJanitor() (stop func()) {
	if s.cfg.SessionRetention <= 0 {
		return func() {}
	}
	return s.goUntilStop(s.ssn.Janitor)
}

// goUntilStop runs f(s.life) in a goroutine; stop ends s.life (on an
// early return too) and waits for f to return.
func (s *server) goUntilStop(f func(context.Context)) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(s.life.Context())
	}()
	return func() {
		s.life.End()
		<-done
	}
}

// startNetwork starts network policy (network.go). Its stop stops the
// background re-adoption, then closes the policy's resolvers: sandboxes
// stay contained.
func (s *server) startNetwork(ctx context.Context) (stop func()) {
	stopAdopting := s.sbx.StartNetPolicy(ctx)
	if s.sbx.NetPolicy() == nil && (s.cfg.Isolate == IsolateAll || s.cfg.Isolate == IsolatePod) {
		s.log.Warn("network policy is not enforced here, so isolated sandboxes get no network namespace of their own: they run as their own uid on the host's network and can reach its loopback services")
	}
	n := s.sbx.NetPolicy()
	return func() {
		stopAdopting() // before Close
		if n != nil {
			n.Close()
		}
	}
}

// writeStarting writes wire.StartingFile with this process's pid
// (tmp+rename, 0600).
func writeStarting(path string) error {
	b, err := json.Marshal(wire.Starting{PID: os.Getpid()})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// removeStarting removes wire.StartingFile if it is this process's: a
// second runnerd that fails on a state directory in use leaves the first
// one's alone.
func removeStarting(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var st wire.Starting
	if json.Unmarshal(b, &st) == nil && st.PID == os.Getpid() {
		os.Remove(path)
	}
}
