package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/daemon"
	"github.com/agentrunner/runner/netpolicy/netlab"
	"github.com/agentrunner/runner/shim/launch"
	"github.com/agentrunner/runner/shim/sessiondir"
	"github.com/agentrunner/runner/wire"
)

// runnerdBin is the real runnerd, built once in TestMain: it is the shim
// executable of every daemon in these tests and the daemon of the restart
// tests, which need a separate process to kill -9.
var runnerdBin string

func TestMain(m *testing.M) {
	// The binaries here are built with the race detector, which sleeps
	// a second at every process exit (GORACE atexit_sleep_ms, default
	// 1000) to let late race reports print: each runnerd stop, runner
	// call and shim exit paid it. Their reports still print; a race
	// found in the last instant of an exit may not.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	dir, err := os.MkdirTemp("", "runnerd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Binaries here (the probe, the attack program) run as the
	// unprivileged identities of isolated sandboxes too.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	runnerdBin = filepath.Join(dir, "runnerd")
	args := []string{"build", "-o", runnerdBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "github.com/agentrunner/runner/cmd/runnerd")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build runnerd:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	before, err := netlab.HostSnapshot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "snapshot host network:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if after, err := netlab.HostSnapshot(); err != nil || after != before {
		fmt.Fprintf(os.Stderr, "FAIL: the tests changed the real host's network (err %v)\nbefore:\n%s\nafter:\n%s\n", err, before, after)
		code = 1
	}
	os.Exit(code)
}

const testToken = "test-token-0123456789"

// api is a minimal HTTP client of runnerd for tests: plain net/http.
type api struct {
	t     *testing.T
	base  string // http://host:port or http://unix
	hc    *http.Client
	token string
	state string
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) code() wire.Code { return wire.Code(r.header.Get(wire.HeaderError)) }

func (r response) errBody(t *testing.T) wire.Error {
	t.Helper()
	var b wire.ErrorBody
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	return b.Error
}

func (a *api) do(method, path string, body any) response {
	a.t.Helper()
	r := a.doErr(method, path, body)
	if r.err != nil {
		a.t.Fatal(r.err)
	}
	return r.response
}

// errResponse is a response, or the error that kept it from arriving.
type errResponse struct {
	response
	err error
}

// doErr is do for a goroutine other than the test's: it returns what
// went wrong instead of failing the test. body is nil, []byte, a string
// or a value sent as JSON.
func (a *api) doErr(method, path string, body any) errResponse {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return errResponse{err: err}
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		return errResponse{err: err}
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return errResponse{err: fmt.Errorf("%s %s: %w", method, path, err)}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return errResponse{err: fmt.Errorf("%s %s: read body: %w", method, path, err)}
	}
	return errResponse{response: response{status: resp.StatusCode, header: resp.Header, body: raw}}
}

// must does the call and decodes a 2xx answer into out.
func (a *api) must(method, path string, body any, wantStatus int, out any) {
	a.t.Helper()
	r := a.do(method, path, body)
	if r.status != wantStatus {
		a.t.Fatalf("%s %s: got %d %s, want %d", method, path, r.status, r.body, wantStatus)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			a.t.Fatalf("%s %s: decode %q: %v", method, path, r.body, err)
		}
	}
}

func (a *api) wantError(r response, status int, code wire.Code) {
	a.t.Helper()
	if r.status != status || r.code() != code {
		a.t.Fatalf("got %d %s (header %q), want %d %s", r.status, r.body, r.code(), status, code)
	}
	if got := r.errBody(a.t).Code; got != code {
		a.t.Fatalf("body code %q, want %q", got, code)
	}
}

func (a *api) createSandbox(name string) wire.Sandbox {
	a.t.Helper()
	var sb wire.Sandbox
	a.must("POST", "/v1/sandboxes", wire.CreateSandbox{Name: name}, 200, &sb)
	return sb
}

func (a *api) spawn(sandbox string, req wire.CreateSession) wire.Session {
	a.t.Helper()
	var s wire.Session
	a.must("POST", "/v1/sandboxes/"+sandbox+"/sessions", req, 201, &s)
	return s
}

func (a *api) exec(sandbox string, req wire.Exec) wire.ExecResult {
	a.t.Helper()
	var res wire.ExecResult
	a.must("POST", "/v1/sandboxes/"+sandbox+"/exec", req, 200, &res)
	return res
}

// attachResult is everything one attach received.
type attachResult struct {
	streams  map[string][]byte
	ends     map[string]int64 // offset after the last data byte per stream
	terminal *wire.Frame      // nil if the connection ended without one
	exit     wire.Exit
	errBody  *wire.Error
	frames   int
	closeErr error
}

// attach reads an attach to its end. stop, when not nil, is called with
// every data frame and may end the read early (returning true) without a
// terminal frame.
func (a *api) attach(ctx context.Context, sandbox, id, query string, stop func(f wire.Frame) bool) attachResult {
	a.t.Helper()
	conn, resp, err := websocket.Dial(ctx, strings.Replace(a.base, "http", "ws", 1)+"/v1/sandboxes/"+sandbox+"/sessions/"+id+"/attach?"+query,
		&websocket.DialOptions{HTTPClient: a.hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + a.token}}})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		a.t.Fatalf("attach: %v (status %d)", err, status)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(2 << 20)
	res := attachResult{streams: map[string][]byte{}, ends: map[string]int64{}}
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			res.closeErr = err
			return res
		}
		if typ != websocket.MessageBinary {
			a.t.Fatalf("attach: got a %v message", typ)
		}
		f, err := wire.ParseFrame(msg)
		if err != nil {
			a.t.Fatalf("attach: parse frame: %v", err)
		}
		if res.terminal != nil {
			a.t.Fatalf("attach: frame %v after the terminal frame", f.Kind)
		}
		res.frames++
		switch f.Kind {
		case wire.FrameData:
			name := f.Stream.StreamName()
			if end, ok := res.ends[name]; ok && f.Offset != end {
				a.t.Fatalf("attach: %s frame at %d, want %d", name, f.Offset, end)
			}
			res.streams[name] = append(res.streams[name], f.Payload...)
			res.ends[name] = f.End()
			if stop != nil && stop(f) {
				return res
			}
		case wire.FrameHeartbeat:
		case wire.FrameExit, wire.FrameLost:
			ff := f
			res.terminal = &ff
			e, err := f.Exit()
			if err != nil {
				a.t.Fatal(err)
			}
			res.exit = e
		case wire.FrameError:
			ff := f
			res.terminal = &ff
			e, err := f.Err()
			if err != nil {
				a.t.Fatal(err)
			}
			res.errBody = e
		}
	}
}

// startDaemon runs daemon.Run in this process on a loopback listener and
// a fresh state directory. Cleanup destroys every sandbox (so no shim
// outlives the test) and stops the daemon.
func startDaemon(t *testing.T) *api {
	t.Helper()
	return startDaemonIn(t, t.TempDir(), testToken)
}

// startDaemonIn starts a daemon without network containment: these tests
// must never change the real host's network (netpolicy_test.go enables it
// against a host namespace of its own).
func startDaemonIn(t *testing.T, state, token string) *api {
	t.Helper()
	return startDaemonCfg(t, daemon.Config{StateDir: state, Token: token, NetPolicy: daemon.NetPolicyOff})
}

// passableState lets other uids pass the directory above a test's state
// directory: as root every sandbox runs as a uid of its own (the default
// --isolate all), which must pass it to reach its workspace, and
// t.TempDir's parent is 0700 (as root's home is, which is why a root
// runnerd's default state is /var/lib/runnerd). Only a test's own
// temporary directories are touched.
func passableState(t *testing.T, state string) {
	t.Helper()
	parent := filepath.Dir(state)
	if os.Geteuid() != 0 || !strings.HasPrefix(parent, os.TempDir()+"/") {
		return
	}

	if err := os.Chmod(parent, 0o711); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// endLeftoverSessions registers a cleanup, run after the daemon's own
// (cleanups run in reverse), that terminates every session still running
// under state: a test that stops its daemon with sessions alive (shims
// outlive runnerd by design) leaves no process behind once it ends.
func endLeftoverSessions(t *testing.T, state string) {
	t.Cleanup(func() {
		socks, _ := filepath.Glob(filepath.Join(state, "s", "*", sessiondir.SocketFile))
		for _, sock := range socks {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if c, err := launch.Dial(ctx, filepath.Dir(sock)); err == nil {
				c.Terminate(ctx, 100*time.Millisecond)
				c.Close()
			}
			cancel()
		}
	})
}

// sharedTempDir is a t.TempDir the commands of isolated sandboxes (other
// uids) may write, for markers a test reads.
func sharedTempDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	passableState(t, d)
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

// startDaemonCfg runs daemon.Run with cfg plus the test defaults.
func startDaemonCfg(t *testing.T, cfg daemon.Config) *api {
	t.Helper()
	a, _ := startDaemonStoppable(t, cfg)
	return a
}

// startDaemonStoppable is startDaemonCfg plus a stop that ends daemon.Run
// (idempotent) and leaves its sessions running, as a restart does; once
// stopped, Cleanup destroys nothing.
func startDaemonStoppable(t *testing.T, cfg daemon.Config) (*api, func()) {
	t.Helper()
	state, token := cfg.StateDir, cfg.Token
	passableState(t, state)
	endLeftoverSessions(t, state)
	if cfg.CgroupRoot == "" {
		// Its own, so daemons of different tests never share a sandbox's
		// cgroup; removed after the daemon (cleanups run in reverse).
		// The same for each start on one state directory (podtools_test.go).
		cfg.CgroupRoot = stateCgroupRoot(t, state)
	}
	l := cfg.TCPListener // a test's own loopback listener, or a new one
	if l == nil {
		var err error
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		cfg.Socket = "none"
		if cfg.ShimCommand == nil {
			cfg.ShimCommand = []string{runnerdBin, "shim"}
		}
		cfg.TCPListener = l
		cfg.Ready = func(string) { close(ready) }
		if cfg.Logger == nil {
			cfg.Logger = testLogger(t)
		}
		cfg.SuspendGrace = 2 * time.Second
		cfg.TerminateGrace = 2 * time.Second
		errc <- daemon.Run(ctx, cfg)
	}()
	select {
	case <-ready:
	case err := <-errc:
		cancel()
		t.Fatalf("daemon.Run: %v", err)
	}
	a := &api{t: t, base: "http://" + l.Addr().String(), hc: &http.Client{Timeout: 60 * time.Second}, token: token, state: state}
	if a.token == "" {
		tok, err := os.ReadFile(filepath.Join(state, "token"))
		if err != nil {
			t.Fatal(err)
		}
		a.token = strings.TrimSpace(string(tok))
	}
	var once sync.Once
	stopped := false
	stop := func() {
		once.Do(func() {
			stopped = true
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("daemon.Run: %v", err)
			}
			a.hc.CloseIdleConnections()
		})
	}
	t.Cleanup(func() {
		if !stopped {
			a.destroyAll()
		}
		stop()
	})
	return a, stop
}

// destroyAll removes every sandbox, which terminates every session.
func (a *api) destroyAll() {
	a.t.Helper()
	token := ""
	for {
		var page wire.SandboxList
		a.must("GET", "/v1/sandboxes?limit=1000&page_token="+token, nil, 200, &page)
		for _, sb := range page.Sandboxes {
			if r := a.do("DELETE", "/v1/sandboxes/"+sb.Name, nil); r.status != 204 {
				a.t.Errorf("destroy %s: %d %s", sb.Name, r.status, r.body)
			}
		}
		if page.NextPageToken == "" {
			return
		}
		token = page.NextPageToken
	}
}

// logWriter sends daemon logs to t.Log, so they show only on failure.
type logWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
