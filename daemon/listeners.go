package daemon

// What runnerd listens on and serves: the control listeners (unix socket,
// TCP with optional TLS) opened before anything is served, the preview and
// metrics listeners, serve with its graceful stop, and the listen file a
// client reads to find them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentrunner/runner/daemon/preview"
	"github.com/agentrunner/runner/wire"
)

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
	s.life.BeginStop()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		srv.Close()
	}
	wg.Wait()
	s.life.Wait()
	return err
}

// logServing says runnerd serves. The cgroup root is on the line people
// read first (cgroups "off" when limits are not enforced; the earlier
// lines say why).
func (s *server) logServing(tcpAddr string) {
	cfg := s.cfg
	cgroups, cgroupRoot := "off", ""
	if s.sbx.Cgroups() != nil {
		cgroups, cgroupRoot = s.sbx.Cgroups().Mode().String(), cfg.CgroupRoot
	}
	s.log.Info("runnerd serving", "state", cfg.StateDir, "tcp", tcpAddr, "tls", cfg.tlsEnabled(), "client_ca", cfg.TLSClientCA != "", "socket", cfg.Socket, "version", cfg.Version, "network_policy", s.sbx.NetPolicy() != nil,
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
