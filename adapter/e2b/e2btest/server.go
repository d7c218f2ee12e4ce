// Package e2btest is a stand-in for E2B, written from the public spec, for
// tests: an httptest control plane (the sandbox subset of e2b-dev/infra
// spec/openapi.yml) and an envd stand-in (service process.Process of
// packages/envd/spec/process/process.proto over the Connect protocol with
// the JSON codec) that runs REAL processes, each sandbox in its own
// directory under t.TempDir().
//
// It reproduces the behaviours measured against envd 0.6.13, which a
// client must survive:
//
//   - stdout, stderr and PTY output arrive in chunks of at most 32 KiB;
//   - a process outlives the request that started it (no kill when the
//     client disconnects);
//   - output produced while nobody subscribes is dropped (no backlog);
//   - Connect-Timeout-Ms on Start is the process's lifetime: the process
//     is killed when it elapses and the stream ends with deadline_exceeded;
//   - CloseStdin on a PTY process is refused (Connect code unknown, 500);
//     a second CloseStdin, or one for a stdin: false process, succeeds;
//   - every process runs under envd's /bin/sh -c '... exec "${@}"'
//     wrapper (a missing program starts, then exits 127), in a clean
//     environment (PATH, HOME, USER, LOGNAME, the sandbox's and the
//     request's variables), as the HTTP Basic user or /init's default
//     "user", uid 2001 (an unknown user is unauthenticated; a stand-in
//     that is not root cannot switch and runs everything as the test's
//     uid), in the sandbox's directory, the user's, unless the request
//     names an existing cwd (a missing one is invalid_argument);
//   - Connect-Timeout-Ms kills the pid only, not its group;
//   - end events carry cmd.Wait's error ("exit status 3");
//   - a Connect to a process that ended within 30 s gets start and end;
//   - keepalives every 90 s unless Keepalive-Ping-Interval says
//     otherwise, restarted by each data event; an interval below 1,
//     which crashes real envd, fails the test;
//   - a request without a secure sandbox's token is envd's plain JSON
//     401; files answers are envd's (an upload 200 text/plain with a
//     JSON list, its file and new directories given to the user, a
//     missing file 404 "path '...' does not exist").
//
// The control plane is E2B's on the points a client depends on: a
// sandbox's time to live (create's timeout, default 15 s, Options.DefaultTimeout
// in tests) is enforced: when it elapses a sandbox created with autoPause
// is paused, any other is killed; POST /sandboxes/{id}/timeout sets it
// anew from now (404 for a paused sandbox, as the orchestrator no longer
// holds it), connect only extends it and resumes a paused sandbox, and
// resume sets it. A paused sandbox freezes every process in it (SIGSTOP
// of every process tagged with its id, runner-shim's detached sessions
// included) and resume continues them, as a VM snapshot keeps memory.
// Listings are newest first and show paused sandboxes beside running
// ones. Only a sandbox created with secure: true has an envd access
// token; envd of any other accepts requests without one.
//
// And the control plane's faults, on demand: an outage (503 everywhere), a
// proxy that drops connections, a list body cut mid-page, 429 with
// Retry-After. The envd proxy answers 502 for a paused or absent sandbox,
// as E2B's edge does.
//
// The stand-in deliberately shares no code with package e2b (its own
// envelope framing and JSON shapes), so a framing mistake in one cannot
// hide in the other.
package e2btest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// EnvdVersion is the envd version the stand-in reports.
const EnvdVersion = "0.6.13"

// Options configures a stand-in. The zero value is usable.
type Options struct {
	// ChunkSize is the largest output chunk; 0 means envd's 32 KiB.
	ChunkSize int
	// KeepaliveInterval, when positive, overrides the client's
	// Keepalive-Ping-Interval header (seconds) for stream keepalives.
	KeepaliveInterval time.Duration
	// RegisterDelay holds a started process back this long before envd
	// registers it (List, SendInput and the other selectors find it) and
	// sends the start event: a client that returns from Start before the
	// start event then races a process envd does not know yet (the seeds'
	// E2B adapter lost that race by about 300 ms).
	RegisterDelay time.Duration
	// DefaultTimeout is the time to live of a sandbox created without a
	// timeout; 0 means the API's 15 s. Tests shorten it here rather than
	// in the client. An explicit timeout is always in whole seconds.
	DefaultTimeout time.Duration
	// Dir, when set, is where sandbox directories are made (default: a
	// new directory in the system's temporary directory, removed at the
	// end): keep it short when sandboxes run runner-shim, whose control
	// socket path must fit in 107 bytes. Run as root, the stand-in makes
	// it 0711 so that the sandbox user (uid 2001) reaches its home; the
	// programs the test runs in sandboxes must be readable by that user.
	Dir string
}

// TagEnv is the environment variable every process the stand-in starts
// carries, set to its sandbox id. Processes that leave the stand-in's
// process groups (runner-shim's detached shims and their commands, which
// inherit it) are found by it and killed when their sandbox is deleted or
// the stand-in shuts down, as a real sandbox's VM takes them with it.
const TagEnv = "E2BTEST_SANDBOX"

// Server is the stand-in. Its methods are safe for concurrent use. New
// registers its shutdown with t.Cleanup: every process it started is
// killed and waited for, every goroutine stopped.
type Server struct {
	// Faults are the switches in front of both servers ("api", rate
	// limited, and "envd").
	*standin.Faults
	// api is the control plane (URL); envd is where envd requests go
	// (SandboxURL), routed on the E2b-Sandbox-Id header.
	api, envd *httptest.Server
	// APIKey is the only key the control plane accepts.
	APIKey string

	t       testing.TB
	opts    Options
	root    string
	closing chan struct{}
	wg      sync.WaitGroup // process waiters and readers

	mu        sync.Mutex // guards everything below and every sandbox's fields
	sandboxes map[string]*sandbox
	seq       uint64
}

type sandbox struct {
	id, template, token string
	seq                 uint64
	timeout             int32     // seconds, as last set
	endAt               time.Time // when the time to live elapses
	autoPause           bool      // expiry pauses rather than kills
	pauses              int       // how many times it was paused
	metadata            map[string]string
	envVars             map[string]string
	state               string
	dir                 string
	started             time.Time
	procs               map[uint32]*proc
	ended               []ended // end events retained for Connect
	// gone is closed when the sandbox is paused or deleted: its open
	// streams are cut, as a pause or kill cuts them on E2B.
	gone chan struct{}
}

// New starts a stand-in for t.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.ChunkSize <= 0 {
		opts.ChunkSize = 32 << 10
	}
	if opts.Dir == "" {
		// Not t.TempDir(): its parent is 0700, and the sandbox user must
		// reach its home.
		dir, err := os.MkdirTemp("", "e2btest")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		opts.Dir = dir
	}
	if os.Geteuid() == 0 {
		// The sandbox user (uid 2001) passes through to its home.
		if err := os.Chmod(opts.Dir, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{
		APIKey:    "e2b_" + standin.RandHex(20),
		t:         t,
		opts:      opts,
		root:      opts.Dir,
		closing:   make(chan struct{}),
		sandboxes: map[string]*sandbox{},
		Faults: &standin.Faults{RateLimited: func(w http.ResponseWriter, _ time.Duration) {
			apiError(w, http.StatusTooManyRequests, "rate limit exceeded")
		}},
	}
	if s.opts.DefaultTimeout <= 0 {
		s.opts.DefaultTimeout = 15 * time.Second
	}
	s.api = s.Serve("api", true, s.apiMux())
	s.envd = s.Serve("envd", false, http.HandlerFunc(s.serveEnvd))
	s.wg.Add(1)
	go s.expire()
	t.Cleanup(s.shutdown)
	return s
}

// URL is the control plane's base URL (Config.APIURL).
func (s *Server) URL() string { return s.api.URL }

// SandboxURL is envd's base URL (Config.SandboxURL).
func (s *Server) SandboxURL() string { return s.envd.URL }

// SetDropEnvd makes the envd proxy (only) drop every connection, as an
// edge proxy in trouble does, until switched off.
func (s *Server) SetDropEnvd(on bool) { s.DropServer("envd", on) }

// Dir returns a sandbox's directory (the working directory of its
// processes) and whether the sandbox exists.
func (s *Server) Dir(sandboxID string) (dir string, ok bool) {
	ok = s.with(sandboxID, func(sb *sandbox) { dir = sb.dir })
	return dir, ok
}

func (s *Server) shutdown() {
	close(s.closing)
	s.mu.Lock()
	var ids []string
	for _, sb := range s.sandboxes {
		ids = append(ids, sb.id)
		for _, p := range sb.procs {
			p.abort()
		}
	}
	s.mu.Unlock()
	for _, id := range ids {
		standin.KillTagged(TagEnv, id)
	}
	s.wg.Wait()
	s.api.Close()
	s.envd.Close()
}

func (s *Server) apiMux() http.Handler {
	return standin.API(standin.HeaderIs("X-API-Key", s.APIKey), func(w http.ResponseWriter, _ *http.Request) {
		apiError(w, http.StatusUnauthorized, "Invalid API key, it must start with 'e2b_' prefix")
	}, standin.Routes{
		"POST /sandboxes":              s.create,
		"GET /sandboxes/{id}":          s.get,
		"DELETE /sandboxes/{id}":       s.delete,
		"POST /sandboxes/{id}/pause":   s.pause,
		"POST /sandboxes/{id}/resume":  s.resume,
		"POST /sandboxes/{id}/connect": s.connect,
		"POST /sandboxes/{id}/timeout": s.setTimeout,
		"GET /v2/sandboxes":            s.list,
	})
}

// apiError writes the API's Error schema.
func apiError(w http.ResponseWriter, status int, msg string) {
	standin.WriteJSON(w, status, map[string]any{"code": status, "message": msg})
}

func notFound(w http.ResponseWriter, id string) {
	apiError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q doesn't exist or you don't have access to it", id))
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TemplateID *string           `json:"templateID"`
		Timeout    *int32            `json:"timeout"`
		AutoPause  bool              `json:"autoPause"`
		Secure     bool              `json:"secure"`
		Metadata   map[string]string `json:"metadata"`
		EnvVars    map[string]string `json:"envVars"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body")
		return
	}
	if req.TemplateID == nil || *req.TemplateID == "" {
		apiError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	if req.Timeout != nil && *req.Timeout < 0 {
		apiError(w, http.StatusBadRequest, "timeout must be >= 0")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	id := "i" + standin.RandHex(10)
	dir := filepath.Join(s.root, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		apiError(w, http.StatusInternalServerError, "create sandbox directory")
		return
	}
	// The directory stands for /home/user: the user's.
	if err := users["user"].own(dir); err != nil {
		apiError(w, http.StatusInternalServerError, "create sandbox directory")
		return
	}
	now := time.Now().UTC()
	sb := &sandbox{
		id: id, template: *req.TemplateID, seq: s.seq, autoPause: req.AutoPause,
		metadata: req.Metadata, envVars: req.EnvVars, state: "running", dir: dir,
		started: now, procs: map[uint32]*proc{}, gone: make(chan struct{}), timeout: 15,
		endAt: now.Add(s.opts.DefaultTimeout),
	}
	if req.Secure {
		sb.token = standin.RandHex(16)
	}
	if req.Timeout != nil {
		sb.timeout = *req.Timeout
		sb.endAt = now.Add(time.Duration(*req.Timeout) * time.Second)
	}
	s.sandboxes[id] = sb
	standin.WriteJSON(w, http.StatusCreated, sb.created())
}

func (sb *sandbox) created() map[string]any {
	m := map[string]any{
		"templateID": sb.template, "sandboxID": sb.id, "clientID": "stand-in",
		"envdVersion": EnvdVersion, "domain": nil,
	}
	if sb.token != "" {
		m["envdAccessToken"] = sb.token
	}
	return m
}

func (sb *sandbox) listed() map[string]any {
	m := map[string]any{
		"templateID": sb.template, "sandboxID": sb.id, "clientID": "stand-in",
		"startedAt": sb.started.Format(time.RFC3339Nano), "endAt": sb.endAt.Format(time.RFC3339Nano),
		"cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "state": sb.state, "envdVersion": EnvdVersion,
	}
	if sb.metadata != nil {
		m["metadata"] = sb.metadata
	}
	return m
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(sb *sandbox) {
		m := sb.listed()
		if sb.token != "" {
			m["envdAccessToken"] = sb.token
		}
		standin.WriteJSON(w, http.StatusOK, m)
	})
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	if !ok {
		s.mu.Unlock()
		notFound(w, r.PathValue("id"))
		return
	}
	procs := s.removeLocked(sb)
	s.mu.Unlock()
	if err := s.kill(sb, procs); err != nil {
		apiError(w, http.StatusInternalServerError, "remove sandbox directory")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// list serves GET /v2/sandboxes newest first (the API's default order,
// by start time), running and paused alike. The cursor is the sequence
// number of the next (older) sandbox, so deletes between pages neither
// repeat nor skip the survivors.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, ok := standin.QueryLimit(q, "limit", 100, 100)
	if !ok {
		apiError(w, http.StatusBadRequest, "limit must be between 1 and 100")
		return
	}
	from := uint64(1<<64 - 1)
	if v := q.Get("nextToken"); v != "" {
		var err error
		if from, err = standin.ParseSeqCursor(v); err != nil {
			apiError(w, http.StatusBadRequest, "invalid next token")
			return
		}
	}
	var meta url.Values
	if v := q.Get("metadata"); v != "" {
		var err error
		if meta, err = url.ParseQuery(v); err != nil {
			apiError(w, http.StatusBadRequest, "invalid metadata filter")
			return
		}
	}
	states := map[string]bool{}
	if v := q.Get("state"); v != "" {
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				apiError(w, http.StatusBadRequest, "invalid state "+strconv.Quote(st))
				return
			}
			states[st] = true
		}
	}
	s.mu.Lock()
	var match []*sandbox
	for _, sb := range s.sandboxes {
		if sb.seq > from || (len(states) > 0 && !states[sb.state]) || !metaMatch(sb.metadata, meta) {
			continue
		}
		match = append(match, sb)
	}
	sort.Slice(match, func(i, j int) bool { return match[i].seq > match[j].seq })
	page := []map[string]any{}
	for i, sb := range match {
		if i == limit {
			w.Header().Set("X-Next-Token", standin.SeqCursor(sb.seq))
			break
		}
		page = append(page, sb.listed())
	}
	s.mu.Unlock()
	s.WriteList(w, "", page)
}

func metaMatch(have map[string]string, want url.Values) bool {
	for k := range want {
		if have[k] != want.Get(k) {
			return false
		}
	}
	return true
}
