package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
)

// TLS on runnerd's TCP listeners (the API and the preview listener). The
// unix socket never speaks TLS: its 0600 mode is its guard.
//
// Decision (docs/operations.md, "TLS"): with Config.TLSClientCA set, a
// client must present a certificate that CA signed (the handshake fails
// otherwise) AND the bearer token. The certificate says the peer is one of
// the fleet's machines; the token says it may drive sandboxes. Keeping
// both means a leaked client key alone, or a leaked token alone, is not
// enough, and a runnerd configured without a client CA behaves exactly as
// before. The preview listener serves browsers, which carry no client
// certificate: it gets the server certificate but never asks for one.

// ErrInsecureListen is returned by Run when a TCP listener would serve
// plain HTTP on an address that is not loopback and Config.InsecureListen
// is not set: the bearer token would cross the network in clear.
var ErrInsecureListen = errors.New("refusing to serve plain HTTP on a non-loopback address")

// ErrTLSConfig is returned by Run when the TLS files cannot be used: a
// missing or unreadable file, a key that does not match its certificate,
// a CA file with no certificate in it, or half a pair.
var ErrTLSConfig = errors.New("bad TLS configuration")

// isLoopbackAddr reports whether addr ("host:port") binds only loopback.
// An empty host, 0.0.0.0, :: and every name but "localhost" are treated as
// reachable from the network: a name can resolve anywhere.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// checkPlainListen refuses a non-loopback plain-HTTP listener unless the
// operator said --insecure-listen, and warns (at every start) when they did.
func checkPlainListen(cfg Config, what, addr string) error {
	if cfg.tlsEnabled() || isLoopbackAddr(addr) {
		return nil
	}
	if !cfg.InsecureListen {
		return fmt.Errorf("%w: %s %s (give --tls-cert and --tls-key, listen on 127.0.0.1, or say --insecure-listen)", ErrInsecureListen, what, addr)
	}
	cfg.Logger.Warn("serving plain HTTP on a non-loopback address (--insecure-listen): the bearer token and every byte cross the network in clear",
		"listener", what, "addr", addr)
	return nil
}

func (cfg Config) tlsEnabled() bool { return cfg.TLSCert != "" }

// checkTLSFiles is withDefaults' part for TLS: a pair or nothing, and a
// client CA only with a pair.
func (cfg Config) checkTLSFiles() error {
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return fmt.Errorf("%w: --tls-cert and --tls-key go together", ErrTLSConfig)
	}
	if cfg.TLSClientCA != "" && cfg.TLSCert == "" {
		return fmt.Errorf("%w: --tls-client-ca needs --tls-cert and --tls-key", ErrTLSConfig)
	}
	return nil
}

// certReloader serves the certificate, key and client CA read from files,
// and reads them again when they change, so a rotation (cert-manager
// renewing a Secret, an operator replacing the files) takes effect at the
// next handshake without a restart. Connections already made keep the
// session they negotiated: a rotation drops no attach.
//
// Why not a library: crypto/tls's GetConfigForClient is the whole hook,
// and what is left (stat three files per handshake, reparse on change) is
// a few lines; the watcher libraries (fsnotify-based) miss Kubernetes'
// atomic symlink swap of a Secret volume unless they watch the directory,
// while a stat follows the symlink and sees the swap.
//
// It is safe for concurrent use (handshakes run on many goroutines).
type certReloader struct {
	cert, key, ca string
	clientAuth    bool // ask for and verify a client certificate (API listener)
	log           *slog.Logger

	mu    sync.Mutex  // guards stamp and conf
	stamp []fileStamp // of cert, key, ca when conf was built
	conf  *tls.Config
}

// fileStamp is what tells a changed file: a rename puts a new inode in
// place, a rewrite changes the size or the modification time.
type fileStamp struct {
	ino  uint64
	size int64
	mod  time.Time
}

func newCertReloader(cfg Config, clientAuth bool) (*certReloader, error) {
	r := &certReloader{cert: cfg.TLSCert, key: cfg.TLSKey, ca: cfg.TLSClientCA, clientAuth: clientAuth && cfg.TLSClientCA != "", log: cfg.Logger}
	stamp, err := r.stamps()
	if err != nil {
		return nil, err
	}
	conf, err := r.load()
	if err != nil {
		return nil, err
	}
	r.stamp, r.conf = stamp, conf
	return r, nil
}

func (r *certReloader) files() []string {
	if r.clientAuth {
		return []string{r.cert, r.key, r.ca}
	}
	return []string{r.cert, r.key}
}

func (r *certReloader) stamps() ([]fileStamp, error) {
	var out []fileStamp
	for _, p := range r.files() {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTLSConfig, err)
		}
		out = append(out, fileStamp{ino: inode(fi), size: fi.Size(), mod: fi.ModTime()})
	}
	return out, nil
}

// load reads the files into a server configuration: TLS 1.2 or later, and
// with a client CA, a verified client certificate required.
func (r *certReloader) load() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		return nil, fmt.Errorf("%w: load certificate %s and key %s: %w", ErrTLSConfig, r.cert, r.key, err)
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if r.clientAuth {
		pem, err := os.ReadFile(r.ca)
		if err != nil {
			return nil, fmt.Errorf("%w: read client CA: %w", ErrTLSConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: client CA %s holds no PEM certificate", ErrTLSConfig, r.ca)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// current returns the configuration for a handshake, reloading it first
// when a file changed. A reload that fails (a half-written rotation: the
// new certificate with the old key) keeps the previous configuration and
// is tried again at the next handshake.
func (r *certReloader) current(*tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	stamp, err := r.stamps()
	if err != nil || stampsEqual(stamp, r.stamp) {
		if err != nil {
			r.log.Warn("TLS files unreadable; serving the loaded certificate", "err", err)
		}
		return r.conf, nil
	}
	conf, err := r.load()
	if err != nil {
		r.log.Warn("TLS files changed but do not load; serving the loaded certificate", "err", err)
		return r.conf, nil
	}
	r.log.Info("TLS certificate reloaded", "cert", r.cert)
	r.stamp, r.conf = stamp, conf
	return conf, nil
}

func stampsEqual(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ino != b[i].ino || a[i].size != b[i].size || !a[i].mod.Equal(b[i].mod) {
			return false
		}
	}
	return true
}

// serverConfig is the listener's configuration: every handshake asks the
// reloader for the current one.
func (r *certReloader) serverConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: r.current}
}

// secureListener wraps l in TLS when cfg has a certificate (Run has
// called checkPlainListen for l's address otherwise). clientAuth asks for
// a client certificate (the API listener, with a client CA).
func secureListener(cfg Config, l net.Listener, clientAuth bool) (net.Listener, error) {
	if !cfg.tlsEnabled() {
		return l, nil
	}
	r, err := newCertReloader(cfg, clientAuth)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(l, r.serverConfig()), nil
}

// inode is the file's inode number, 0 where the platform has none.
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
