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
	"github.com/agentrunner/runner/shim"
	"github.com/agentrunner/runner/wire"
)

// Run serves runnerd until ctx ends, then stops serving gracefully: it
// stops accepting, closes attaches (clients reattach from their cursors),
// waits up to cfg.ShutdownTimeout for in-flight requests, and closes the
// registry. It never stops a session: shims are detached and outlive it.
//
// Run fails at once if another runnerd holds the state directory.
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

	token, err := loadToken(cfg.StateDir, cfg.Token)
	if err != nil {
		return err
	}
	reg, err := registry.Open(filepath.Join(cfg.StateDir, "registry.db"))
	if err != nil {
		return fmt.Errorf("%w (is another runnerd using %s?)", err, cfg.StateDir)
	}
	defer reg.Close()
	if err := reg.SetReserve(filepath.Join(cfg.StateDir, reserveFile), cfg.DiskReserve); err != nil {
		return err
	}
	if cfg.WarmShims > 0 {
		// Closed after the listeners and in-flight requests are done (the
		// defers run in reverse): idle warm shims exit, taken ones are
		// sessions and keep running.
		cfg.pool = shim.NewPool(cfg.ShimCommand, shim.PoolOptions{Size: cfg.WarmShims,
			Root: filepath.Join(cfg.StateDir, "s"), RetainBytes: cfg.JournalRetainBytes})
		defer cfg.pool.Close()
	}

	// Before anything touches identities or cgroups: another runnerd on
	// the host must not hold the same ones (claim.go).
	ids, err := reg.Identities()
	if err != nil {
		return fmt.Errorf("read registry: %w", err)
	}
	hc, err := claimHost(&cfg, len(ids) > 0)
	if err != nil {
		return err
	}
	defer hc.release()
	log.Info("identity range and cgroup root claimed", "identity_range", fmt.Sprintf("%d-%d", cfg.IdentityFirst, cfg.IdentityLast), "cgroup_root", cfg.CgroupRoot)

	s := newServer(cfg, reg)
	if err := s.initIdentities(); err != nil {
		return err
	}
	s.token = token
	defer s.endLife() // beginStop ends it on a clean stop; this on an early return
	// Deferred registry commits land before the registry closes (defers
	// run in reverse; this one after s.streams.Wait below).
	defer s.commits.close()
	// One inotify instance for every follow reader: the kernel allows 128
	// per user. Closed after the tracked handlers end (defers run after
	// s.streams.Wait below).
	s.watcher = newWatcher(log)
	defer s.watcher.Close()
	s.routes()
	if err := s.recoverCheckpoints(); err != nil { // checkpoints.go: before any disk is used
		return fmt.Errorf("recover checkpoints: %w", err)
	}
	if err := s.reconcile(ctx); err != nil {
		return fmt.Errorf("recover sessions: %w", err)
	}
	defer s.startCgroups()() // limits.go; adopts the sandboxes' cgroups before serving
	if cfg.MaxSandboxEndedSessions > 0 {
		// sessions_cap.go; ends and is waited for as the janitor below.
		collectorDone := make(chan struct{})
		go func() {
			defer close(collectorDone)
			s.collector(s.life)
		}()
		defer func() {
			s.endLife()
			<-collectorDone
		}()
	}
	if cfg.SessionRetention > 0 {
		// It ends when Run begins stopping (s.life) and is waited for
		// before the registry closes (defers run in reverse).
		janitorDone := make(chan struct{})
		go func() {
			defer close(janitorDone)
			s.janitor(s.life)
		}()
		defer func() {
			s.endLife() // on an early return too
			<-janitorDone
		}()
	}
	stopAdopting := s.startNetPolicy(ctx)
	if s.net == nil && s.ids.all {
		log.Warn("network policy is not enforced here, so isolated sandboxes get no network namespace of their own: they run as their own uid on the host's network and can reach its loopback services")
	}
	if s.net != nil {
		// Sandboxes stay contained: Close stops only the resolvers.
		defer s.net.Close()
	}
	defer stopAdopting() // before Close (defers run in reverse)

	var listeners []net.Listener
	closeListeners := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	tcpAddr := ""
	var tcp net.Listener
	switch {
	case cfg.TCPListener != nil:
		if err := checkPlainListen(cfg, "api", cfg.TCPListener.Addr().String()); err != nil {
			cfg.TCPListener.Close()
			return err
		}
		tcp = cfg.TCPListener
	case cfg.Listen != "none":
		// Refused before binding: nothing is listening when Run says no.
		if err := checkPlainListen(cfg, "api", cfg.Listen); err != nil {
			return err
		}
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen %s: %w", cfg.Listen, err)
		}
		tcp = l
	}
	if tcp != nil {
		// tls.go: TLS when configured, else loopback or --insecure-listen.
		l, err := secureListener(cfg, tcp, true)
		if err != nil {
			tcp.Close()
			return err
		}
		listeners = append(listeners, l)
		tcpAddr = l.Addr().String()
	}
	if cfg.Socket != "none" {
		// The registry lock proves no other runnerd uses this state
		// directory, so a socket file here is a stale one.
		if err := os.Remove(cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			closeListeners()
			return fmt.Errorf("remove stale socket: %w", err)
		}
		l, err := listenUnix(cfg.Socket)
		if err != nil {
			closeListeners()
			return err
		}
		listeners = append(listeners, l)
	}

	if cfg.PreviewListen != "" {
		pv, err := preview.New(preview.Config{URLTemplate: cfg.PreviewURLTemplate, Lookup: s.previewLookup, Logger: log})
		if err != nil {
			closeListeners()
			return fmt.Errorf("preview listener: %w", err)
		}
		if err := checkPlainListen(cfg, "preview", cfg.PreviewListen); err != nil {
			pv.Close()
			closeListeners()
			return err
		}
		pl, err := net.Listen("tcp", cfg.PreviewListen)
		if err != nil {
			pv.Close()
			closeListeners()
			return fmt.Errorf("listen %s: %w", cfg.PreviewListen, err)
		}
		// Browsers carry no client certificate: the preview listener
		// gets the server certificate only (tls.go).
		if spl, err := secureListener(cfg, pl, false); err != nil {
			pl.Close()
			pv.Close()
			closeListeners()
			return err
		} else {
			pl = spl
		}
		s.preview = pv
		pvDone := make(chan struct{})
		go func() {
			defer close(pvDone)
			pv.Serve(pl) // returns once pv.Close has run
		}()
		defer func() {
			pv.Close()
			<-pvDone
		}()
	}

	if cfg.MetricsListener != nil || cfg.MetricsListen != "" {
		ml := cfg.MetricsListener
		if ml == nil {
			if ml, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
				closeListeners()
				return fmt.Errorf("listen %s: %w", cfg.MetricsListen, err)
			}
		}
		msrv := &http.Server{Handler: s.metricsHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		mDone := make(chan struct{})
		go func() {
			defer close(mDone)
			msrv.Serve(ml) // returns once msrv.Close has run
		}()
		// Closed before the registry (defers run in reverse): a scrape
		// reads it.
		defer func() {
			msrv.Close()
			<-mDone
		}()
		log.Info("metrics listener", "addr", ml.Addr().String())
	}

	socket := ""
	if cfg.Socket != "none" {
		socket = cfg.Socket
	}
	listenPath := filepath.Join(cfg.StateDir, wire.ListenFile)
	if err := writeListen(listenPath, wire.Listen{TCP: tcpAddr, TLS: tcpAddr != "" && cfg.tlsEnabled(), Socket: socket, PID: os.Getpid()}); err != nil {
		closeListeners()
		return err
	}
	// Removed only at a clean stop: the registry lock proves the file is
	// this daemon's.
	defer os.Remove(listenPath)
	removeStarting(startingPath) // serving now: listen.json says where

	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          nil,
	}
	serveErr := make(chan error, len(listeners))
	var wg sync.WaitGroup
	for _, l := range listeners {
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
	// The cgroup root is on the line people read first: the one that
	// says runnerd serves (cgroups "off" when limits are not enforced;
	// the earlier lines say why).
	cgroups, cgroupRoot := "off", ""
	if s.cg != nil {
		cgroups, cgroupRoot = s.cg.Mode().String(), cfg.CgroupRoot
	}
	log.Info("runnerd serving", "state", cfg.StateDir, "tcp", tcpAddr, "tls", cfg.tlsEnabled(), "client_ca", cfg.TLSClientCA != "", "socket", cfg.Socket, "version", cfg.Version, "network_policy", s.net != nil,
		"cgroups", cgroups, "cgroup_root", cgroupRoot)
	if err := sdNotify("READY=1"); err != nil {
		log.Warn("sd_notify READY", "err", err)
	}
	if cfg.Ready != nil {
		cfg.Ready(tcpAddr)
	}

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	log.Info("runnerd stopping; sessions keep running")
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
