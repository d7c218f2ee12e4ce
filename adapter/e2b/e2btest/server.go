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
//   - CloseStdin on a PTY process is refused (Connect code unknown, 500).
//
// And the control plane's faults, on demand: an outage (503 everywhere), a
// proxy that drops connections, a list body cut mid-page, 429 with
// Retry-After. Pause stops a sandbox's processes (SIGSTOP) and resume
// continues them; the envd proxy answers 502 for a paused or absent
// sandbox, as E2B's edge does. Sandbox time-to-live is not modelled: a
// sandbox lives until deleted.
//
// The stand-in deliberately shares no code with package e2b (its own
// envelope framing and JSON shapes), so a framing mistake in one cannot
// hide in the other.
package e2btest

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
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
	// Dir, when set, is where sandbox directories are made (default
	// t.TempDir()): keep it short when sandboxes run runner-shim, whose
	// control socket path must fit in 107 bytes.
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
	// api is the control plane (URL); envd is where envd requests go
	// (SandboxURL), routed on the E2b-Sandbox-Id header.
	api, envd *httptest.Server
	// APIKey is the only key the control plane accepts.
	APIKey string

	opts    Options
	root    string
	closing chan struct{}
	wg      sync.WaitGroup // process waiters and readers

	mu         sync.Mutex // guards everything below and every sandbox's fields
	sandboxes  map[string]*sandbox
	seq        uint64
	outage     bool
	drop       bool
	dropEnvd   bool
	interrupt  int
	rateLimit  int
	retryAfter time.Duration
	requests   map[string]int // "METHOD /path" → count, for tests
}

type sandbox struct {
	id, template, token string
	seq                 uint64
	timeout             int32 // seconds; recorded, not enforced
	metadata            map[string]string
	envVars             map[string]string
	state               string
	dir                 string
	started             time.Time
	procs               map[uint32]*proc
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
		opts.Dir = t.TempDir()
	}
	s := &Server{
		APIKey:    "e2b_" + randHex(20),
		opts:      opts,
		root:      opts.Dir,
		closing:   make(chan struct{}),
		sandboxes: map[string]*sandbox{},
		requests:  map[string]int{},
	}
	s.api = httptest.NewServer(s.faults(s.apiMux(), true))
	s.envd = httptest.NewServer(s.faults(http.HandlerFunc(s.serveEnvd), false))
	t.Cleanup(s.shutdown)
	return s
}

// URL is the control plane's base URL (Config.APIURL).
func (s *Server) URL() string { return s.api.URL }

// SandboxURL is envd's base URL (Config.SandboxURL).
func (s *Server) SandboxURL() string { return s.envd.URL }

// SetOutage makes both servers answer every request 503 while on.
func (s *Server) SetOutage(on bool) { s.mu.Lock(); s.outage = on; s.mu.Unlock() }

// SetDropEnvd makes the envd proxy (only) drop every connection, as an
// edge proxy in trouble does, until switched off.
func (s *Server) SetDropEnvd(on bool) { s.mu.Lock(); s.dropEnvd = on; s.mu.Unlock() }

// SetDropConnections makes both servers close every connection without an
// answer while on, as a failing proxy does.
func (s *Server) SetDropConnections(on bool) { s.mu.Lock(); s.drop = on; s.mu.Unlock() }

// InterruptList cuts the body of the next n list answers mid-page: the
// status and Content-Length are sent, then the connection is closed.
func (s *Server) InterruptList(n int) { s.mu.Lock(); s.interrupt = n; s.mu.Unlock() }

// RateLimit answers the next n control-plane requests 429 with
// Retry-After in whole seconds.
func (s *Server) RateLimit(n int, retryAfter time.Duration) {
	s.mu.Lock()
	s.rateLimit, s.retryAfter = n, retryAfter
	s.mu.Unlock()
}

// Dir returns a sandbox's directory (the working directory of its
// processes) and whether the sandbox exists.
func (s *Server) Dir(sandboxID string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[sandboxID]
	if !ok {
		return "", false
	}
	return sb.dir, true
}

// Requests returns how many requests matched "METHOD /path" (the path
// with ids, e.g. "POST /process.Process/Start" or "GET /v2/sandboxes").
func (s *Server) Requests(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[key]
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

// faults applies the switches before any handler.
func (s *Server) faults(next http.Handler, api bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests[r.Method+" "+r.URL.Path]++
		drop, outage := s.drop || (!api && s.dropEnvd), s.outage
		limited := false
		if !drop && !outage && s.rateLimit > 0 && api {
			s.rateLimit--
			limited = true
		}
		ra := s.retryAfter
		s.mu.Unlock()
		switch {
		case drop:
			hj, ok := w.(http.Hijacker)
			if !ok {
				panic(http.ErrAbortHandler)
			}
			conn, _, err := hj.Hijack()
			if err == nil {
				conn.Close()
			}
		case outage:
			http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		case limited:
			w.Header().Set("Retry-After", strconv.Itoa(int(ra/time.Second)))
			apiError(w, http.StatusTooManyRequests, "rate limit exceeded")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func (s *Server) apiMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.create)
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.delete)
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.resume)
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	mux.HandleFunc("GET /v2/sandboxes", s.list)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != s.APIKey {
			apiError(w, http.StatusUnauthorized, "Invalid API key, it must start with 'e2b_' prefix")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// apiError writes the API's Error schema.
func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func notFound(w http.ResponseWriter, id string) {
	apiError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q doesn't exist or you don't have access to it", id))
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TemplateID *string           `json:"templateID"`
		Timeout    *int32            `json:"timeout"`
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
	id := "i" + randHex(10)
	dir := filepath.Join(s.root, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		apiError(w, http.StatusInternalServerError, "create sandbox directory")
		return
	}
	sb := &sandbox{
		id: id, template: *req.TemplateID, token: randHex(16), seq: s.seq,
		metadata: req.Metadata, envVars: req.EnvVars, state: "running", dir: dir,
		started: time.Now().UTC(), procs: map[uint32]*proc{}, gone: make(chan struct{}), timeout: 15,
	}
	if req.Timeout != nil {
		sb.timeout = *req.Timeout
	}
	s.sandboxes[id] = sb
	writeJSON(w, http.StatusCreated, sb.created())
}

func (sb *sandbox) created() map[string]any {
	return map[string]any{
		"templateID": sb.template, "sandboxID": sb.id, "clientID": "stand-in",
		"envdVersion": EnvdVersion, "envdAccessToken": sb.token, "domain": nil,
	}
}

func (sb *sandbox) listed() map[string]any {
	m := map[string]any{
		"templateID": sb.template, "sandboxID": sb.id, "clientID": "stand-in",
		"startedAt": sb.started.Format(time.RFC3339Nano), "endAt": sb.started.Add(time.Hour).Format(time.RFC3339Nano),
		"cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "state": sb.state, "envdVersion": EnvdVersion,
	}
	if sb.metadata != nil {
		m["metadata"] = sb.metadata
	}
	return m
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	if !ok {
		notFound(w, r.PathValue("id"))
		return
	}
	m := sb.listed()
	m["envdAccessToken"] = sb.token
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	if !ok {
		s.mu.Unlock()
		notFound(w, r.PathValue("id"))
		return
	}
	delete(s.sandboxes, sb.id)
	procs := sb.procs
	sb.procs = map[uint32]*proc{}
	if sb.state == "running" {
		close(sb.gone)
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.abort()
		<-p.done
	}
	standin.KillTagged(TagEnv, sb.id)
	if err := os.RemoveAll(sb.dir); err != nil {
		apiError(w, http.StatusInternalServerError, "remove sandbox directory")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	switch {
	case !ok:
		notFound(w, r.PathValue("id"))
	case sb.state == "paused":
		apiError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already paused", sb.id))
	default:
		sb.state = "paused"
		close(sb.gone)
		// A paused sandbox keeps its memory: its processes stop, they do
		// not die.
		for _, p := range sb.procs {
			p.signalGroup(sigStop)
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// wake resumes a paused sandbox; the caller holds s.mu.
func (sb *sandbox) wake() {
	sb.state = "running"
	sb.gone = make(chan struct{})
	for _, p := range sb.procs {
		p.signalGroup(sigCont)
	}
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	switch {
	case !ok:
		notFound(w, r.PathValue("id"))
	case sb.state == "running":
		apiError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already running", sb.id))
	default:
		sb.wake()
		writeJSON(w, http.StatusCreated, sb.created())
	}
}

// setTimeout validates and records the time to live (the stand-in does
// not expire sandboxes; Timeout reports the last value set).
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int32 `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Timeout == nil || *req.Timeout < 0 {
		apiError(w, http.StatusBadRequest, "timeout is required")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	if !ok {
		notFound(w, r.PathValue("id"))
		return
	}
	sb.timeout = *req.Timeout
	w.WriteHeader(http.StatusNoContent)
}

// Timeout returns the time to live last set for a sandbox, in seconds
// (at create or through the timeout call), and whether it exists.
func (s *Server) Timeout(sandboxID string) (int32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[sandboxID]
	if !ok {
		return 0, false
	}
	return sb.timeout, true
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int32 `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Timeout == nil || *req.Timeout < 0 {
		apiError(w, http.StatusBadRequest, "timeout is required")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[r.PathValue("id")]
	switch {
	case !ok:
		notFound(w, r.PathValue("id"))
	case sb.state == "running":
		writeJSON(w, http.StatusOK, sb.created())
	default:
		sb.wake()
		writeJSON(w, http.StatusCreated, sb.created())
	}
}

// list serves GET /v2/sandboxes in creation order. The cursor is the
// sequence number of the next sandbox, so deletes between pages neither
// repeat nor skip the survivors.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			apiError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	var from uint64
	if v := q.Get("nextToken"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err == nil {
			from, err = strconv.ParseUint(string(b), 10, 64)
		}
		if err != nil {
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
		if sb.seq < from || (len(states) > 0 && !states[sb.state]) || !metaMatch(sb.metadata, meta) {
			continue
		}
		match = append(match, sb)
	}
	sort.Slice(match, func(i, j int) bool { return match[i].seq < match[j].seq })
	page := []map[string]any{}
	for i, sb := range match {
		if i == limit {
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatUint(sb.seq, 10))))
			break
		}
		page = append(page, sb.listed())
	}
	cut := s.interrupt > 0
	if cut {
		s.interrupt--
	}
	s.mu.Unlock()
	if !cut {
		writeJSON(w, http.StatusOK, page)
		return
	}
	b, _ := json.Marshal(page)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b[:len(b)/2])
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	// Aborting closes the connection short of Content-Length.
	panic(http.ErrAbortHandler)
}

func metaMatch(have map[string]string, want url.Values) bool {
	for k := range want {
		if have[k] != want.Get(k) {
			return false
		}
	}
	return true
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
