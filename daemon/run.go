package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/preview"
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
	if err := s.initIdentities(); err != nil {
		return nil, nil, err
	}
	s.token = token
	stops = append(stops, s.endLife) // beginStop ends it on a clean stop; this on an early return
	// Deferred registry commits land before the registry closes (stops
	// run in reverse; this one after s.streams.Wait in serve).
	stops = append(stops, s.commits.close)
	// One inotify instance for every follow reader: the kernel allows 128
	// per user. Closed after the tracked handlers end (stops run after
	// s.streams.Wait in serve).
	s.watcher = newWatcher(cfg.Logger)
	stops = append(stops, func() { s.watcher.Close() })
	s.routes()
	if err := s.recoverState(ctx); err != nil {
		return nil, nil, err
	}
	stops = append(stops, s.startCgroups()) // limits.go; adopts the sandboxes' cgroups in the background
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
	if err := s.recoverCheckpoints(); err != nil { // checkpoints.go: before any disk is used
		return fmt.Errorf("recover checkpoints: %w", err)
	}
	if err := s.reconcile(ctx); err != nil {
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
	return s.goUntilStop(s.collector)
}

// startJanitor starts the retention janitor (recovery.go) when a retention
// is set. It ends when Run begins stopping (s.life) and is waited for
// before the registry closes (defers run in reverse).
func (s *server) startJanitor() (stop func()) {
	if s.cfg.SessionRetention <= 0 {
		return func() {}
	}
	return s.goUntilStop(s.janitor)
}

// goUntilStop runs f(s.life) in a goroutine; stop ends s.life (on an
// early return too) and waits for f to return.
func (s *server) goUntilStop(f func(context.Context)) (stop func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(s.life)
	}()
	return func() {
		s.endLife()
		<-done
	}
}

// startNetwork starts network policy (network.go). Its stop stops the
// background re-adoption, then closes the policy's resolvers: sandboxes
// stay contained.
func (s *server) startNetwork(ctx context.Context) (stop func()) {
	stopAdopting := s.startNetPolicy(ctx)
	if s.net == nil && s.ids.all {
		s.log.Warn("network policy is not enforced here, so isolated sandboxes get no network namespace of their own: they run as their own uid on the host's network and can reach its loopback services")
	}
	n := s.net
	return func() {
		stopAdopting() // before Close
		if n != nil {
			n.Close()
		}
	}
}

// startListeners opens the API listeners (served later by serve) and
// starts the preview and metrics listeners. stop stops the metrics
// listener, then the preview one; the API listeners are closed by serve's
// shutdown, or by the caller (ls.close) on a failure before it. On an
// error, startListeners has closed what it opened.
func (s *server) startListeners() (ls *listeners, stop func(), err error) {
	ls, err = openListeners(s.cfg)
	if err != nil {
		return nil, nil, err
	}
	stopPreview, err := s.startPreview()
	if err != nil {
		ls.close()
		return nil, nil, err
	}
	stopMetrics, err := s.startMetrics()
	if err != nil {
		stopPreview()
		ls.close()
		return nil, nil, err
	}
	return ls, func() {
		// Closed before the registry (stops run in reverse): a scrape
		// reads it.
		stopMetrics()
		stopPreview()
	}, nil
}

// listeners are the API listeners Run serves on: TCP (TLS or plain) and
// the unix socket.
type listeners struct {
	all     []net.Listener
	tcpAddr string
}

// close closes every listener; a unix listener removes its socket file.
func (ls *listeners) close() {
	for _, l := range ls.all {
		l.Close()
	}
}

// listen is what listen.json says about ls.
func (ls *listeners) listen(cfg Config) wire.Listen {
	socket := ""
	if cfg.Socket != "none" {
		socket = cfg.Socket
	}
	return wire.Listen{TCP: ls.tcpAddr, TLS: ls.tcpAddr != "" && cfg.tlsEnabled(), Socket: socket, PID: os.Getpid()}
}

// openListeners opens the API listeners cfg asks for. On an error it
// closes what it opened (and cfg.TCPListener).
func openListeners(cfg Config) (*listeners, error) {
	ls := &listeners{}
	var tcp net.Listener
	switch {
	case cfg.TCPListener != nil:
		if err := checkPlainListen(cfg, "api", cfg.TCPListener.Addr().String()); err != nil {
			cfg.TCPListener.Close()
			return nil, err
		}
		tcp = cfg.TCPListener
	case cfg.Listen != "none":
		// Refused before binding: nothing is listening when Run says no.
		if err := checkPlainListen(cfg, "api", cfg.Listen); err != nil {
			return nil, err
		}
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
		}
		tcp = l
	}
	if tcp != nil {
		// tls.go: TLS when configured, else loopback or --insecure-listen.
		l, err := secureListener(cfg, tcp, true)
		if err != nil {
			tcp.Close()
			return nil, err
		}
		ls.all = append(ls.all, l)
		ls.tcpAddr = l.Addr().String()
	}
	if cfg.Socket != "none" {
		// The registry lock proves no other runnerd uses this state
		// directory, so a socket file here is a stale one.
		if err := os.Remove(cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			ls.close()
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
		l, err := listenUnix(cfg.Socket)
		if err != nil {
			ls.close()
			return nil, err
		}
		ls.all = append(ls.all, l)
	}
	return ls, nil
}

// startPreview starts the preview listener when configured; stop closes
// it and waits for its server.
func (s *server) startPreview() (stop func(), err error) {
	cfg := s.cfg
	if cfg.PreviewListen == "" {
		return func() {}, nil
	}
	pv, err := preview.New(preview.Config{URLTemplate: cfg.PreviewURLTemplate, Lookup: s.previewLookup, Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("preview listener: %w", err)
	}
	if err := checkPlainListen(cfg, "preview", cfg.PreviewListen); err != nil {
		pv.Close()
		return nil, err
	}
	pl, err := net.Listen("tcp", cfg.PreviewListen)
	if err != nil {
		pv.Close()
		return nil, fmt.Errorf("listen %s: %w", cfg.PreviewListen, err)
	}
	// Browsers carry no client certificate: the preview listener
	// gets the server certificate only (tls.go).
	spl, err := secureListener(cfg, pl, false)
	if err != nil {
		pl.Close()
		pv.Close()
		return nil, err
	}
	s.preview = pv
	pvDone := make(chan struct{})
	go func() {
		defer close(pvDone)
		pv.Serve(spl) // returns once pv.Close has run
	}()
	return func() {
		pv.Close()
		<-pvDone
	}, nil
}

// startMetrics starts the metrics listener when configured; stop closes
// it and waits for its server.
func (s *server) startMetrics() (stop func(), err error) {
	cfg := s.cfg
	if cfg.MetricsListener == nil && cfg.MetricsListen == "" {
		return func() {}, nil
	}
	ml := cfg.MetricsListener
	if ml == nil {
		if ml, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("listen %s: %w", cfg.MetricsListen, err)
		}
	}
	msrv := &http.Server{Handler: s.metricsHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	mDone := make(chan struct{})
	go func() {
		defer close(mDone)
		msrv.Serve(ml) // returns once msrv.Close has run
	}()
	s.log.Info("metrics listener", "addr", ml.Addr().String())
	return func() {
		msrv.Close()
		<-mDone
	}, nil
}

// serve serves the API on ls until ctx ends or a listener fails, then
// stops: it ends the server's life, shuts the HTTP server down within
// cfg.ShutdownTimeout and waits for every tracked stream handler.
func (s *server) serve(ctx context.Context, ls *listeners) (err error) {
	cfg := s.cfg
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          nil,
	}
	serveErr := make(chan error, len(ls.all))
	var wg sync.WaitGroup
	for _, l := range ls.all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// shapedListener: net/http's own error answers get the
			// documented shape too (errors.go).
			if err := srv.Serve(shapedListener{Listener: l, s: s}); err != nil && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("serve %s: %w", l.Addr(), err)
			}
		}()
	}
	s.logServing(ls.tcpAddr)
	if err := sdNotify("READY=1"); err != nil {
		s.log.Warn("sd_notify READY", "err", err)
	}
	if cfg.Ready != nil {
		cfg.Ready(ls.tcpAddr)
	}

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	s.log.Info("runnerd stopping; sessions keep running")
	sdNotify("STOPPING=1")
	s.beginStop()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		srv.Close()
	}
	wg.Wait()
	s.streams.Wait()
	return err
}

// logServing says runnerd serves. The cgroup root is on the line people
// read first (cgroups "off" when limits are not enforced; the earlier
// lines say why).
func (s *server) logServing(tcpAddr string) {
	cfg := s.cfg
	cgroups, cgroupRoot := "off", ""
	if s.cg != nil {
		cgroups, cgroupRoot = s.cg.Mode().String(), cfg.CgroupRoot
	}
	s.log.Info("runnerd serving", "state", cfg.StateDir, "tcp", tcpAddr, "tls", cfg.tlsEnabled(), "client_ca", cfg.TLSClientCA != "", "socket", cfg.Socket, "version", cfg.Version, "network_policy", s.net != nil,
		"cgroups", cgroups, "cgroup_root", cgroupRoot)
}

// listenUnix listens on a unix socket at path that is 0600 from the moment
// anyone can reach it. bind(2) creates the socket with the umask's mode
// and a chmod after it leaves a window, so it is bound in a fresh 0700
// directory next to path (which no one else may enter), chmodded there, and
// only then renamed into place. Closing the listener removes path.
func listenUnix(path string) (net.Listener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".sock")
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // it is unlinked at path, not at tmp
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return &unixListener{UnixListener: ul, path: path}, nil
}

// unixListener removes its socket file once, at the first Close.
type unixListener struct {
	*net.UnixListener
	path string
	once sync.Once
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() { os.Remove(l.path) })
	return err
}

// writeListen writes the listen file (tmp+rename, 0600), so a client never
// reads a half-written one.
func writeListen(path string, l wire.Listen) error {
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("write %s: %w", wire.ListenFile, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", wire.ListenFile, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", wire.ListenFile, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", wire.ListenFile, err)
	}
	return nil
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

// ErrShimUnusable is returned by Run, before it serves anything, when the
// shim it would start every session with cannot run: a runnerd that
// answered /healthz but failed every spawn would look healthy to a
// supervisor and to its operator.
var ErrShimUnusable = errors.New("the shim cannot run sessions")

// shimVersionTimeout bounds the shim's answer to --version.
const shimVersionTimeout = 10 * time.Second

// checkShim checks that argv[0] of the shim command is an executable file
// and, when want (runnerd's version) is set, that it is the same build: it
// must answer "--version" with want. A shim that does not understand
// --version (runner-shim before it had one) is accepted with a warning,
// since its existence and mode were shown. Errors wrap ErrShimUnusable and
// name the path and the fix.
func checkShim(ctx context.Context, argv []string, want string, log *slog.Logger) error {
	path := argv[0]
	fix := "install runner-shim from the same build as runnerd at that path (images/install.sh installs both), or start runnerd without --shim to use its built-in shim"
	if _, err := exec.LookPath(path); err != nil {
		return fmt.Errorf("%w: shim %s: %w; %s", ErrShimUnusable, path, errors.Unwrap(err), fix)
	}
	if want == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, shimVersionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--version")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		// Exit status 2 is a usage error, what a flag parser answers to a
		// flag it does not know; anything else (a crash, a signal, a
		// timeout) is a shim that cannot run.
		if errors.As(err, &ee) && ee.ExitCode() == 2 && ctx.Err() == nil {
			log.Warn("cannot check the shim's version: it does not answer --version (a runner-shim built before it had one?)",
				"shim", path, "want", want, "exit", ee.ExitCode(), "stderr", firstLine(stderr.String()))
			return nil
		}
		return fmt.Errorf("%w: shim %s: run --version: %w; %s", ErrShimUnusable, path, err, fix)
	}
	got := strings.TrimSpace(string(out))
	// runnerd --version and runner-shim --version print the version, or
	// "runner-shim VERSION": the last word is the version.
	if f := strings.Fields(got); len(f) > 0 {
		got = f[len(f)-1]
	}
	if got != want {
		return fmt.Errorf("%w: shim %s is version %q, runnerd is %q; %s", ErrShimUnusable, path, got, want, fix)
	}
	return nil
}

// firstLine is s up to its first newline, trimmed: a usage error's
// message, without the usage text after it.
func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
