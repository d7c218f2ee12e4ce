// Package apiservertest runs a real kube-apiserver over an embedded etcd
// for tests of client/fleet/k8s: watches, resource versions, 410 Gone and
// RBAC as a cluster's API server has them, which client-go's fake
// clientset does not.
//
// Both binaries are built from Go modules through the module proxy into a
// cache directory (Build; CacheDir says where), once per version: a first
// run pays minutes of build, later runs start the server in seconds. The
// servers run in a network namespace of the test's own, loopback only;
// the test reaches them by dialing from inside it (Server.Config), so
// nothing listens on the host's network. There is no kubelet, scheduler
// or controller manager: pods are created and their status set by the
// test, as the DaemonSet controller and a kubelet would.
//
// The package needs root (for the namespace) and, on a cold cache, the
// module proxy; a test that lacks either is skipped loudly through
// internal/testcap (failed under CI=true).
package apiservertest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/internal/loopns"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/agentrunner/runner/internal/testcap"
	"github.com/agentrunner/runner/internal/testpki"
)

const (
	apiAddr  = "127.0.0.1:6443"
	etcdAddr = "127.0.0.1:2379"
)

// Server is a running kube-apiserver and its etcd, in the test's network
// namespace. Start makes it; the test's cleanup stops both processes (by
// pid) and removes their files. Its methods are safe for concurrent use.
type Server struct {
	// URL is the API server's address, reachable only through Config.
	URL string
	// AdminToken authenticates as a member of system:masters.
	AdminToken string

	t      testing.TB
	bins   Binaries
	dir    string
	caFile string
	ns     *loopns.NS

	mu      sync.Mutex // guards api, cut, conns
	api     *proc
	cut     bool                  // Cut: gated dials are refused
	conns   map[net.Conn]struct{} // open gated connections
	etcd    *proc
	etcdMu  sync.Mutex // serialises compactions
	apiArgs []string   // kube-apiserver's flags, kept for RestartAPIServer
}

// proc is a process Server started, with its log file.
type proc struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when Wait returned
}

// Start builds (or finds cached) and starts etcd and kube-apiserver in a
// network namespace of t's own and waits until the API server is ready.
// It skips t through testcap when the host cannot have them (not root, no
// module proxy on a cold cache).
func Start(t testing.TB) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		testcap.Skip(t, "root", "a network namespace for kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	bins, err := Build(ctx, testLog{t})
	if errors.Is(err, ErrNoModules) {
		testcap.Skip(t, "kube-apiserver", fmt.Sprintf("build a real API server from Go modules: %v", err))
	}
	if err != nil {
		t.Fatalf("build kube-apiserver: %v", err)
	}
	ns, err := loopns.New()
	if err != nil {
		testcap.Skip(t, "netns", err.Error())
	}
	s := &Server{
		URL:        "https://" + apiAddr,
		AdminToken: "admin-" + randHex(t),
		t:          t,
		bins:       bins,
		dir:        t.TempDir(),
		ns:         ns,
		conns:      map[net.Conn]struct{}{},
	}
	t.Cleanup(s.stop)

	ca := testpki.NewCA(t, s.dir, "apiserver-ca")
	s.caFile = ca.CertFile
	serving := ca.Server(t, "apiserver", "kubernetes.default.svc")
	// The service-account token signer: an ECDSA key (the public half is
	// read from the same file).
	sa := ca.Client(t, "service-account-signer")
	tokens := filepath.Join(s.dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(s.AdminToken+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	etcdData := filepath.Join(s.dir, "etcd")
	s.etcd = s.spawn("etcd", bins.Etcd, "--data-dir", etcdData,
		"--client-url", "http://"+etcdAddr, "--peer-url", "http://127.0.0.1:2380")
	s.waitHTTP(ctx, s.etcd, "etcd", "http://"+etcdAddr+"/health", "", 30*time.Second)

	s.apiArgs = []string{
		"--etcd-servers=http://" + etcdAddr,
		"--advertise-address=127.0.0.1", "--bind-address=127.0.0.1", "--secure-port=6443",
		// No kubernetes Service endpoints: v1.37 refuses a loopback
		// advertise address to its endpoint reconciler, and nothing here
		// reaches the API server through the Service.
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + serving.CertFile, "--tls-private-key-file=" + serving.KeyFile,
		"--service-account-key-file=" + sa.KeyFile, "--service-account-signing-key-file=" + sa.KeyFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--token-auth-file=" + tokens,
		// The DaemonSet's installer is privileged, on the host network
		// and PID namespace, as deploy/k8s makes it.
		"--allow-privileged=true",
		"--profiling=false",
	}
	s.startAPI(ctx)
	return s
}

// startAPI starts kube-apiserver and waits until /readyz says ok.
func (s *Server) startAPI(ctx context.Context) {
	s.t.Helper()
	p := s.spawn("kube-apiserver", s.bins.APIServer, s.apiArgs...)
	s.mu.Lock()
	s.api = p
	s.mu.Unlock()
	s.waitHTTP(ctx, p, "kube-apiserver", s.URL+"/readyz", s.AdminToken, 2*time.Minute)
}

// RestartAPIServer stops kube-apiserver (SIGTERM, by pid) and starts it
// again over the same etcd, as a control-plane rollout does: every watch
// ends, and the new server's watch cache starts at etcd's current
// revision.
func (s *Server) RestartAPIServer(ctx context.Context) {
	s.t.Helper()
	s.mu.Lock()
	p := s.api
	s.api = nil
	s.mu.Unlock()
	if err := p.terminate(30 * time.Second); err != nil {
		s.t.Fatalf("stop kube-apiserver: %v", err)
	}
	s.startAPI(ctx)
}

// spawn starts bin in the netns with its output in a log file.
func (s *Server) spawn(name, bin string, args ...string) *proc {
	s.t.Helper()
	log, err := os.OpenFile(filepath.Join(s.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.ns.Start(cmd); err != nil {
		log.Close()
		s.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }() // ends when the process does
	return p
}

// terminate ends p: SIGTERM by pid, SIGKILL after grace.
func (p *proc) terminate(grace time.Duration) error {
	if p == nil {
		return nil
	}
	defer p.log.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("pid %d ignored SIGTERM for %s", p.cmd.Process.Pid, grace)
}

func (s *Server) stop() {
	s.mu.Lock()
	api := s.api
	s.api = nil
	s.mu.Unlock()
	if err := api.terminate(30 * time.Second); err != nil {
		s.t.Errorf("stop kube-apiserver: %v", err)
	}
	if err := s.etcd.terminate(30 * time.Second); err != nil {
		s.t.Errorf("stop etcd: %v", err)
	}
	if s.t.Failed() {
		for _, name := range []string{"etcd", "kube-apiserver"} {
			b, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			s.t.Logf("%s log (tail):\n%s", name, b)
		}
	}
	s.Heal()
	s.ns.Close()
}

// waitHTTP polls url from inside the netns until it answers 200, and
// fails the test if p exits first or limit passes.
func (s *Server) waitHTTP(ctx context.Context, p *proc, name, url, token string, limit time.Duration) {
	s.t.Helper()
	c := s.httpClient()
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			last = "exited: " + p.cmd.ProcessState.String()
			deadline = time.Now()
			continue
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %.200s", resp.Status, b)
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	s.t.Fatalf("%s not ready in %s (last: %s); log tail:\n%s", name, limit, last, b)
}

// httpClient is a plain client that dials inside the netns and trusts the
// API server's CA.
func (s *Server) httpClient() *http.Client {
	cfg := &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: s.caFile}}
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: s.ns.Dial, TLSClientConfig: tlsCfg}}
}

// AdminConfig is a client configuration with the admin token; its
// connections are never cut.
func (s *Server) AdminConfig() *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     s.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: s.caFile},
		Dial:            s.ns.Dial,
		QPS:             -1, // no client-side rate limit in tests
	}
}

// Admin is a clientset with the admin token.
func (s *Server) Admin() *kubernetes.Clientset {
	s.t.Helper()
	cs, err := kubernetes.NewForConfig(s.AdminConfig())
	if err != nil {
		s.t.Fatal(err)
	}
	return cs
}

// Config is a client configuration authenticating with token, whose
// connections Cut breaks.
func (s *Server) Config(token string) *rest.Config {
	c := s.AdminConfig()
	c.BearerToken = token
	c.Dial = s.gatedDial
	return c
}

func (s *Server) gatedDial(ctx context.Context, network, addr string) (net.Conn, error) {
	s.mu.Lock()
	cut := s.cut
	s.mu.Unlock()
	if cut {
		return nil, refused(network, addr)
	}
	c, err := s.ns.Dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cut {
		c.Close()
		return nil, refused(network, addr)
	}
	gc := &gatedConn{Conn: c, s: s}
	s.conns[gc] = struct{}{}
	return gc, nil
}

// refused is the error a dial to a stopped API server's address meets:
// the connection is refused. (client-go's reflector retries a watch from
// its resource version on that error, rather than relisting.)
func refused(network, addr string) error {
	a, _ := net.ResolveTCPAddr(network, addr)
	return &net.OpError{Op: "dial", Net: network, Addr: a, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

type gatedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *gatedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// Cut closes every connection made through Config and refuses new dials
// (ECONNREFUSED) until Heal, as a stopped API server's address does: the
// clients' watches end and cannot restart.
func (s *Server) Cut() {
	s.mu.Lock()
	s.cut = true
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Heal lets Config's clients dial again.
func (s *Server) Heal() {
	s.mu.Lock()
	s.cut = false
	s.mu.Unlock()
}

// CompactEtcd compacts etcd's history up to its current revision (through
// etcd's JSON gateway) and returns that revision: a watch from an older
// resource version can then only be answered 410 Gone.
func (s *Server) CompactEtcd(ctx context.Context) (int64, error) {
	s.etcdMu.Lock()
	defer s.etcdMu.Unlock()
	c := s.httpClient()
	post := func(path string, body any, out any) error {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+etcdAddr+path, bytes.NewReader(b))
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, rb)
		}
		return json.Unmarshal(rb, out)
	}
	var rng struct {
		Header struct {
			Revision int64 `json:"revision,string"`
		} `json:"header"`
	}
	if err := post("/v3/kv/range", map[string]any{"key": base64.StdEncoding.EncodeToString([]byte("/")), "limit": 1}, &rng); err != nil {
		return 0, fmt.Errorf("read etcd revision: %w", err)
	}
	var cmp struct{}
	if err := post("/v3/kv/compaction", map[string]any{"revision": rng.Header.Revision, "physical": true}, &cmp); err != nil {
		return 0, fmt.Errorf("compact etcd at %d: %w", rng.Header.Revision, err)
	}
	return rng.Header.Revision, nil
}

// testLog writes build progress to the test's log.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
