// Package runnerdtest starts real runnerd processes for the tests of the
// packages that drive one over the network (client, client/fleet): it
// builds runnerd once, starts daemons on fresh state directories and
// loopback ports that stay the same across restarts, kills, stops and
// restarts them, and puts a loopback proxy in front of one that can cut a
// listing mid-body. It is test support: no production code imports it.
//
// Invariants: a daemon listens on 127.0.0.1 only and runs with network
// containment and sandbox cgroups off unless the caller's flags confine
// them (as root they would otherwise touch the real host's namespace and
// the test process's cgroup); Stop ends only the processes this package
// started (the daemon by its pid, then the shims its state directory
// names), and removes the state directory.
package runnerdtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentrunner/runner/internal/gobuild"
)

// Main is a test package's TestMain body: it builds runnerd into a fresh
// temporary directory (prefix names it), calls setup with the binary's
// path (nil: none), runs the tests, stops every daemon this package
// started, removes the directory, and when the tests passed fails the run
// on a leaked goroutine (goleak). It returns the exit code for os.Exit.
func Main(m *testing.M, prefix string, setup func(bin string) error) int {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := Build(dir)
	if err == nil && setup != nil {
		err = setup(bin)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		StopAll()
		return 1
	}
	// What runs now is not the tests': snapshot it before they start (a
	// snapshot taken after them would ignore every goroutine they leaked).
	before := goleak.IgnoreCurrent()
	code := m.Run()
	StopAll()
	if code == 0 {
		if err := goleak.Find(before); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// Build compiles cmd/runnerd into dir and returns the binary's path.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "runnerd")
	if err := gobuild.Build(bin, "", "github.com/agentrunner/runner/cmd/runnerd"); err != nil {
		return "", fmt.Errorf("build runnerd: %w", err)
	}
	return bin, nil
}

// Daemon is a real runnerd process on a state directory and a loopback
// port that stay the same across restarts.
// Its methods are safe for concurrent use.
type Daemon struct {
	State   string
	Addr    string // 127.0.0.1:port
	Preview string // the preview listener's 127.0.0.1:port
	Token   string
	bin     string
	log     *os.File
	flags   []string // extra runnerd flags, kept across restarts
	tls     bool     // flags hold --tls-cert: URL is https

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd
}

var daemons struct {
	sync.Mutex
	all []*Daemon
}

// Start starts the runnerd at bin on a fresh state directory (not a
// t.TempDir: a shared daemon outlives the test that started it) and
// returns once it answers /healthz.
//
// Network containment is off ("--netpolicy off"): as root, runnerd would
// otherwise set up nftables in the real host's namespace. A test that
// wants it passes netlab's flags in flags, which confine it to namespaces
// the test creates.
func Start(tb testing.TB, bin string, flags ...string) *Daemon {
	tb.Helper()
	d, err := Launch(bin, flags...)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// Launch is Start without a test (for TestMain).
func Launch(bin string, flags ...string) (*Daemon, error) {
	if len(flags) == 0 {
		flags = []string{"--netpolicy", "off"}
	}
	// Sandbox cgroups are the daemon tests' subject (each with a cgroup
	// root of its own, removed at cleanup); here they would be made in the
	// test process's cgroup and outlive a runnerd a test kills.
	// A test that asks for cgroups (client's checkpoint tests) names
	// --cgroups and a --cgroup-root of its own.
	if !slices.Contains(flags, "--cgroups") {
		flags = append(flags, "--cgroups", "off")
	}
	state, err := os.MkdirTemp("", "runnerd-state-")
	if err != nil {
		return nil, err
	}
	free := func() (string, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer ln.Close()
		return ln.Addr().String(), nil
	}
	addr, err := free()
	if err != nil {
		return nil, err
	}
	paddr, err := free()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(state, "runnerd.log"))
	if err != nil {
		return nil, err
	}
	d := &Daemon{State: state, Addr: addr, Preview: paddr, bin: bin, log: log, flags: flags, tls: slices.Contains(flags, "--tls-cert")}
	daemons.Lock()
	daemons.all = append(daemons.all, d)
	daemons.Unlock()
	if err := d.start(); err != nil {
		// A runnerd that did not answer in time may still run: stop it
		// here, since the caller gets no Daemon to stop.
		err = fmt.Errorf("start runnerd: %v\n%s", err, d.LogTail())
		d.Stop()
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(state, "token"))
	if err != nil {
		return nil, err
	}
	d.Token = strings.TrimSpace(string(b))
	return d, nil
}

// URL is the daemon's base URL.
// URL is the daemon's API address: https when its flags give it a
// certificate.
func (d *Daemon) URL() string {
	if d.tls {
		return "https://" + d.Addr
	}
	return "http://" + d.Addr
}

func (d *Daemon) start() error {
	_, port, _ := net.SplitHostPort(d.Preview)
	cmd := exec.Command(d.bin, "--state", d.State, "--listen", d.Addr, "--socket", "none", "--log-level", "debug",
		"--preview-listen", d.Preview, "--preview-url", "http://{token}.localhost:"+port+"/")
	cmd.Args = append(cmd.Args, d.flags...)
	cmd.Env = append(os.Environ(), "RUNNERD_TOKEN=")
	cmd.Stdout, cmd.Stderr = d.log, d.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	d.mu.Lock()
	d.cmd = cmd
	d.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if d.tls {
			// A TLS runnerd (perhaps requiring client certificates) is
			// serving once its listen file names this process.
			if b, err := os.ReadFile(filepath.Join(d.State, "listen.json")); err == nil && strings.Contains(string(b), fmt.Sprintf(`"pid":%d`, cmd.Process.Pid)) {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		resp, err := http.Get(d.URL() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("runnerd did not answer /healthz within 20s")
}

// Kill9 kills the daemon process (not its sessions: shims are detached).
func (d *Daemon) Kill9() {
	d.mu.Lock()
	cmd := d.cmd
	d.cmd = nil
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// Restart starts the daemon again on the same state directory and port.
func (d *Daemon) Restart(tb testing.TB) {
	tb.Helper()
	if err := d.start(); err != nil {
		tb.Fatalf("restart runnerd: %v\n%s", err, d.LogTail())
	}
}

// Signal sends sig to the daemon; for SIGSTOP it returns once the
// process is stopped (the kernel stops a thread busy on another CPU a
// moment later, and a request sent in that moment would still be served).
func (d *Daemon) Signal(sig syscall.Signal) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(sig)
	if sig != syscall.SIGSTOP {
		return
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if allStopped(d.cmd.Process.Pid) {
			return
		}
	}
}

// allStopped reports whether every thread of pid is stopped (state T), or
// pid cannot be read.
func allStopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return true
	}
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if i := bytes.LastIndexByte(b, ')'); err == nil && i > 0 && i+2 < len(b) && b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// Stop stops the daemon gracefully, then every shim it started, then
// removes the state directory.
func (d *Daemon) Stop() {
	d.Signal(syscall.SIGCONT)
	d.mu.Lock()
	cmd := d.cmd
	d.cmd = nil
	d.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	KillShims(d.State)
	d.log.Close()
	os.RemoveAll(d.State)
}

// KillShims kills, each with its process group, the shims whose pid files
// lie under the runnerd state directory state, and the pods' holders
// STATE/pods names (each checked by its start time; a pod's processes end
// with its holder): call it only on a state directory of a runnerd the
// test started, once that runnerd has stopped (shims and pods outlive
// their daemon by design), so that it ends only the test's own processes.
func KillShims(state string) {
	killPods(state)
	pids, _ := filepath.Glob(filepath.Join(state, "s", "*", "shim.pid"))
	for _, p := range pids {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			// A session's shim leads its own process group (its
			// session): kill the group, then the shim.
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// killPods kills the holders STATE/pods/NAME names ("PID START"), each
// only while its start time still names it.
func killPods(state string) {
	files, _ := filepath.Glob(filepath.Join(state, "pods", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var pid int
		var start uint64
		if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil || pid <= 1 {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) > 19 && f[19] == strconv.FormatUint(start, 10) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// LogTail returns the last 4000 bytes of the daemon's log.
func (d *Daemon) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(d.State, "runnerd.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// StopAll stops every daemon this package started and not yet stopped.
func StopAll() {
	daemons.Lock()
	all := daemons.all
	daemons.all = nil
	daemons.Unlock()
	for _, d := range all {
		d.Stop()
	}
}

// Proxy is a loopback HTTP proxy in front of a daemon that the test
// controls: it can cut the next sandbox listing mid-body.
type Proxy struct {
	srv      *http.Server
	ln       net.Listener
	upstream *url.URL
	rp       *httputil.ReverseProxy
	wg       sync.WaitGroup

	mu      sync.Mutex // guards cutList
	cutList int        // number of listings still to cut
}

// StartProxy starts a Proxy in front of upstream (a daemon's URL).
func StartProxy(tb testing.TB, upstream string) *Proxy {
	tb.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, upstream: u}
	p.rp = httputil.NewSingleHostReverseProxy(u)
	p.rp.ErrorLog = nil
	p.rp.FlushInterval = -1
	p.rp.Transport = &http.Transport{Proxy: nil, DisableKeepAlives: true}
	p.srv = &http.Server{Handler: p, ErrorLog: nil}
	p.wg.Go(func() { _ = p.srv.Serve(ln) })
	return p
}

// URL is the proxy's base URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

// InterruptList makes the next GET /v1/sandboxes answer be cut after its
// headers and part of its body (the connection is closed).
func (p *Proxy) InterruptList() {
	p.mu.Lock()
	p.cutList++
	p.mu.Unlock()
}

// ServeHTTP forwards r, or cuts it (InterruptList).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/sandboxes" {
		p.mu.Lock()
		cut := p.cutList > 0
		if cut {
			p.cutList--
		}
		p.mu.Unlock()
		if cut {
			p.cut(w, r)
			return
		}
	}
	p.rp.ServeHTTP(w, r)
}

// cut forwards r, sends the answer's headers (Content-Length included) and
// half of its body, then aborts the connection.
func (p *Proxy) cut(w http.ResponseWriter, r *http.Request) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = p.upstream.Scheme, p.upstream.Host
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(body[:len(body)/2])
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler)
}

// Close stops the proxy and waits for it.
func (p *Proxy) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	_ = p.srv.Close()
	p.wg.Wait()
	if t, ok := p.rp.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}
