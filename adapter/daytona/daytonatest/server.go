// Package daytonatest is a stand-in for Daytona, written from the public
// spec, for tests: an httptest control plane (the sandbox subset of
// daytonaio/daytona apps/api) and a toolbox proxy in front of a toolbox
// daemon stand-in (apps/daemon pkg/toolbox and pkg/session) that runs
// REAL processes, each sandbox in its own directory under t.TempDir().
//
// The control plane is a state machine: a created sandbox is creating,
// then started after Options.StartDelay; stop goes through stopping to
// stopped (processes die, the directory stays) and start back through
// starting; delete is asynchronous: the sandbox shows destroying until
// Options.DeleteDelay passes, then GET answers 404, but its name is free at
// once. Transitions happen when the sandbox is next looked at, so the
// stand-in runs no timers.
//
// The toolbox reproduces what the daemon (v0.190.0, checked against a
// daemon built from that tag) does to a session command, which a client
// must survive:
//
//   - a session is a real shell (zsh, else bash, as /etc/shells lists them:
//     Options.ShellsFile) reading commands on its stdin; each command's
//     file is SOURCED in that shell, so commands run one after another,
//     `exit 4` ends the session (its command never gets an exit code, and
//     a later exec answers 500 "...broken pipe"), and cd and variables
//     carry over to the next command;
//   - each command's stdout and stderr pass through a line-reading shell
//     loop into one log, every line prefixed with 01 01 01 (stdout) or
//     02 02 02 (stderr): NUL bytes are dropped, a final newline is added,
//     the markers are not escaped (the same bytes in a payload look alike);
//   - the exit code is appended with `>>` once the loops drained, so a
//     read can meet the file empty: GET .../command/{id} then answers 500
//     "failed to convert exit code to int: ..." (SetExitCodeRace forces it);
//   - the log's format follows X-Daytona-SDK-Version and
//     X-Daytona-Split-Output: plain text with the markers removed or
//     kept, raw bytes (invalid UTF-8 stays as it is), or, for an SDK from
//     0.167.0, JSON {output, stdout, stderr} (where invalid UTF-8 becomes
//     U+FFFD);
//   - input is a JSON string; "\n" is appended unless present and the input
//     is echoed into the log as stdout; the write blocks, with no deadline,
//     until the command opens its stdin and reads; input to a command whose
//     exit code the daemon has read is 410;
//   - an async command's stdin is held open by a `sleep 3600` that outlives
//     the command until its session goes: there is no way to close a
//     command's stdin, and none to kill one command;
//   - DELETE of a session sends SIGTERM to its process group and every
//     descendant, checks every 100 ms (Options.TerminationCheck) and sends
//     SIGKILL after 5 s (Options.TerminationGrace): it answers after one
//     check at best;
//   - /process/execute runs the command through the shell (stdin), merges
//     stdout and stderr into one JSON string, and has no timeout unless
//     one is given;
//   - errors come in the daemon's three shapes: a typed error's JSON body
//     with its prefix ("not found: session not found"), a wrapped one as a
//     500 ("failed to execute command: not found: session not found"),
//     and gin's AbortWithError, a status with an empty body (upload
//     failures, a missing download, a bad exec request); an unknown route
//     is gin's plain "404 page not found".
//
// And the faults, on demand: an outage (503 everywhere), a proxy that drops
// connections, a list body cut mid-page, 429 with Retry-After, the
// exit-code race at a rate, a session shell killed as the OOM killer does
// (OOMKillSession). The toolbox proxy answers 502 with a plain body for a
// sandbox that is not started or does not exist, as a proxy does.
//
// The stand-in deliberately shares no code with package daytona, so a
// mistake in one cannot hide in the other.
//
// Files: server.go (the control plane), toolbox.go (the toolbox's routes,
// its state and error shapes), sessions.go and commands.go (its session
// and command endpoints), files.go, logs.go.
package daytonatest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// Options configures a stand-in. The zero value is usable.
type Options struct {
	// StartDelay is how long creating and starting last; 0 means 30 ms.
	StartDelay time.Duration
	// StopDelay is how long stopping lasts; 0 means 30 ms.
	StopDelay time.Duration
	// DeleteDelay is how long a deleted sandbox shows destroying; 0 means
	// 30 ms.
	DeleteDelay time.Duration
	// FailSnapshot, when set, names a snapshot whose sandboxes end in state
	// error (errorReason set) instead of started.
	FailSnapshot string
	// ShellsFile is the file the shell is chosen from (default
	// /etc/shells), as the daemon's GetShell reads it.
	ShellsFile string
	// TerminationGrace is how long a session DELETE waits after SIGTERM
	// before SIGKILL; 0 means the daemon's default, 5 s.
	TerminationGrace time.Duration
	// TerminationCheck is how often a session DELETE checks that the
	// session's processes are gone; 0 means the daemon's default, 100 ms.
	TerminationCheck time.Duration
	// Dir, when set, is where sandbox directories are made (default
	// t.TempDir()): keep it short when sandboxes run runner-shim, whose
	// control socket path must fit in 107 bytes.
	Dir string
}

// TagEnv is the environment variable every process the stand-in starts
// carries, set to its sandbox id. Processes that leave the stand-in's
// process groups (runner-shim's detached sessions, which inherit it) are
// found by it and killed when their sandbox stops, is deleted, or the
// stand-in shuts down, as a real sandbox's VM takes them with it.
const TagEnv = "DAYTONATEST_SANDBOX"

// Server is the stand-in. Its methods are safe for concurrent use. New
// registers its shutdown with t.Cleanup: every process it started is
// killed and waited for.
type Server struct {
	// Faults are the switches in front of both servers ("api", rate
	// limited, and "toolbox").
	*standin.Faults
	api, toolbox *httptest.Server
	// APIKey is the only key the API and the toolbox proxy accept.
	APIKey string

	opts   Options
	root   string
	ctx    context.Context // ends at shutdown; bounds every process
	cancel context.CancelFunc
	wg     sync.WaitGroup // process waiters

	mu        sync.Mutex // guards everything below and every sandbox's fields
	sandboxes map[string]*sandbox
	seq       uint64
	// raceRate is the rate of forced exit-code races; races counts them.
	raceRate float64
	races    int
}

type sandbox struct {
	id, name, snapshot string
	seq                uint64
	env, labels        map[string]string
	blockAll           bool
	allowList          string
	state              string
	errorReason        string
	// next is the state the sandbox reaches at due (empty: none pending).
	next     string
	due      time.Time
	dir      string // the sandbox's disk; its home is dir/home
	created  time.Time
	sessions map[string]*session
}

// New starts a stand-in for t.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	for _, d := range []*time.Duration{&opts.StartDelay, &opts.StopDelay, &opts.DeleteDelay} {
		if *d <= 0 {
			*d = 30 * time.Millisecond
		}
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.ShellsFile == "" {
		opts.ShellsFile = "/etc/shells"
	}
	if opts.TerminationGrace <= 0 {
		opts.TerminationGrace = 5 * time.Second
	}
	if opts.TerminationCheck <= 0 {
		opts.TerminationCheck = 100 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		APIKey:    "dtn_" + standin.RandHex(24),
		opts:      opts,
		root:      opts.Dir,
		ctx:       ctx,
		cancel:    cancel,
		sandboxes: map[string]*sandbox{},
		Faults: &standin.Faults{OutageBody: "<html>503 Service Temporarily Unavailable</html>",
			RateLimited: func(w http.ResponseWriter, _ time.Duration) {
				apiError(w, http.StatusTooManyRequests, "ThrottlerException: Too Many Requests")
			}},
	}
	s.api = s.Serve("api", true, s.apiMux())
	s.toolbox = s.Serve("toolbox", false, http.HandlerFunc(s.serveToolbox))
	t.Cleanup(s.shutdown)
	return s
}

// URL is the API's base URL (Config.APIURL).
func (s *Server) URL() string { return s.api.URL }

// ToolboxProxyURL is the toolbox proxy the API names in every sandbox.
func (s *Server) ToolboxProxyURL() string { return s.toolbox.URL + "/toolbox" }

// SetDropToolbox makes only the toolbox proxy close every connection
// without an answer while on (with SetOutage: the API answers 503 while
// the toolbox drops).
func (s *Server) SetDropToolbox(on bool) { s.DropServer("toolbox", on) }

// SetExitCodeRace makes each read of a command record whose exit code the
// daemon has not cached yet (GET of the command, of its session, of the
// session list) answer, at rate (0..1), the daemon's 500 for an exit code
// file met empty. The real window is the moment between `>>` creating the
// file and writing the code, so the stand-in forces it wherever a reader
// may meet it.
func (s *Server) SetExitCodeRace(rate float64) { s.mu.Lock(); s.raceRate = rate; s.mu.Unlock() }

// ExitCodeRaces returns how many answers SetExitCodeRace forced.
func (s *Server) ExitCodeRaces() int { s.mu.Lock(); defer s.mu.Unlock(); return s.races }

// OOMKillSession kills the session's shell and everything in its process
// group with SIGKILL, as the OOM killer may: nothing of the wrapper runs
// after, so its command never gets an exit code and its FIFOs stay. The
// session stays listed, as on the daemon, which never notices. It reports
// whether the session exists.
func (s *Server) OOMKillSession(sandboxID, sessionID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[sandboxID]
	if !ok {
		return false
	}
	ss, ok := sb.sessions[sessionID]
	if ok {
		_ = syscall.Kill(-ss.shell.Process.Pid, syscall.SIGKILL)
	}
	return ok
}

// Home returns a sandbox's home directory (the working directory of its
// processes) and whether the sandbox exists.
func (s *Server) Home(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return "", false
	}
	return filepath.Join(sb.dir, "home"), true
}

func (s *Server) shutdown() {
	s.cancel()
	s.mu.Lock()
	for _, sb := range s.sandboxes {
		sb.killSessions()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.api.Close()
	s.toolbox.Close()
}

func (s *Server) apiMux() http.Handler {
	return standin.API(standin.Bearer(s.APIKey), func(w http.ResponseWriter, _ *http.Request) {
		apiError(w, http.StatusUnauthorized, "Unauthorized")
	}, standin.Routes{
		"POST /sandbox":                       s.create,
		"GET /sandbox":                        s.list,
		"GET /sandbox/{id}":                   s.get,
		"DELETE /sandbox/{id}":                s.delete,
		"POST /sandbox/{id}/stop":             s.stop,
		"POST /sandbox/{id}/start":            s.start,
		"GET /sandbox/{id}/toolbox-proxy-url": s.proxyURL,
	})
}

// apiError writes NestJS's error body.
func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"statusCode": status, "message": msg, "error": http.StatusText(status)})
}

// nestJSON is the Content-Type of NestJS's JSON answers.
const nestJSON = "application/json; charset=utf-8"

// writeJSON writes NestJS's JSON answer (its Content-Type names the
// charset).
func writeJSON(w http.ResponseWriter, status int, v any) {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", nestJSON)
	}
	standin.WriteJSON(w, status, v)
}

func notFound(w http.ResponseWriter, idOrName string) {
	apiError(w, http.StatusNotFound, fmt.Sprintf("Sandbox with ID or name %s not found", idOrName))
}

// advance moves sb to its pending state when due; the caller holds s.mu.
// It reports false when the sandbox is gone (deleted and past its delay).
func (s *Server) advance(sb *sandbox) bool {
	if sb.next == "" || time.Now().Before(sb.due) {
		return true
	}
	sb.state, sb.next = sb.next, ""
	if sb.state == "destroyed" {
		delete(s.sandboxes, sb.id)
		return false
	}
	return true
}

// find looks a sandbox up by id or by name (the API's idOrName); a
// sandbox being destroyed is found by id only (its name is free). The
// caller holds s.mu.
func (s *Server) find(idOrName string) (*sandbox, bool) {
	if sb, ok := s.sandboxes[idOrName]; ok {
		if s.advance(sb) {
			return sb, true
		}
		return nil, false
	}
	for _, sb := range s.sandboxes {
		if sb.name == idOrName && sb.state != "destroying" && sb.next != "destroyed" {
			if s.advance(sb) {
				return sb, true
			}
		}
	}
	return nil, false
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name             string            `json:"name"`
		Snapshot         string            `json:"snapshot"`
		Env              map[string]string `json:"env"`
		Labels           map[string]string `json:"labels"`
		NetworkBlockAll  bool              `json:"networkBlockAll"`
		NetworkAllowList string            `json:"networkAllowList"`
		CPU              *float64          `json:"cpu"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body")
		return
	}
	if req.CPU != nil && *req.CPU < 0 {
		apiError(w, http.StatusBadRequest, "cpu must not be less than 0")
		return
	}
	if strings.ContainsAny(req.Name, "/ ") {
		apiError(w, http.StatusBadRequest, "Sandbox name can only contain letters, digits, dots, underscores and dashes")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := randUUID()
	if req.Name == "" {
		req.Name = id
	}
	if _, ok := s.find(req.Name); ok {
		apiError(w, http.StatusConflict, fmt.Sprintf("Sandbox with name %s already exists", req.Name))
		return
	}
	dir := filepath.Join(s.root, id)
	if err := os.MkdirAll(filepath.Join(dir, "home"), 0o700); err != nil {
		apiError(w, http.StatusInternalServerError, "create sandbox directory")
		return
	}
	s.seq++
	sb := &sandbox{
		id: id, name: req.Name, snapshot: req.Snapshot, seq: s.seq, env: req.Env, labels: req.Labels,
		blockAll: req.NetworkBlockAll, allowList: req.NetworkAllowList, state: "creating", next: "started",
		due: time.Now().Add(s.opts.StartDelay), dir: dir, created: time.Now().UTC(), sessions: map[string]*session{},
	}
	if sb.snapshot == "" {
		sb.snapshot = "daytonaio/sandbox:stand-in"
	}
	if s.opts.FailSnapshot != "" && sb.snapshot == s.opts.FailSnapshot {
		sb.next, sb.errorReason = "error", "snapshot "+sb.snapshot+" failed to start"
	}
	s.sandboxes[id] = sb
	writeJSON(w, http.StatusOK, s.dto(sb))
}

// dto renders the Sandbox schema; the caller holds s.mu.
func (s *Server) dto(sb *sandbox) map[string]any {
	labels := sb.labels
	if labels == nil {
		labels = map[string]string{}
	}
	env := sb.env
	if env == nil {
		env = map[string]string{}
	}
	return map[string]any{
		"id": sb.id, "name": sb.name, "organizationId": "org-stand-in", "snapshot": sb.snapshot, "user": "daytona",
		"env": env, "labels": labels, "public": false, "target": "us", "cpu": 1, "gpu": 0, "memory": 1, "disk": 3,
		"state": sb.state, "networkBlockAll": sb.blockAll, "networkAllowList": sb.allowList,
		"toolboxProxyUrl": s.ToolboxProxyURL(), "createdAt": sb.created.Format(time.RFC3339Nano),
		"updatedAt": sb.created.Format(time.RFC3339Nano), "errorReason": sb.errorReason,
	}
}

// withPath calls f with the sandbox the request's {id} (an id or a
// name) names, under s.mu; one the stand-in does not hold is the API's
// 404.
func (s *Server) withPath(w http.ResponseWriter, r *http.Request, f func(*sandbox)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.find(r.PathValue("id"))
	if !ok {
		notFound(w, r.PathValue("id"))
		return
	}
	f(sb)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(sb *sandbox) { writeJSON(w, http.StatusOK, s.dto(sb)) })
}

func (s *Server) proxyURL(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(*sandbox) {
		writeJSON(w, http.StatusOK, map[string]string{"url": s.ToolboxProxyURL()})
	})
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(sb *sandbox) {
		if sb.state == "destroying" {
			// Deleting twice is accepted, as the API does for a sandbox
			// already on its way out.
			writeJSON(w, http.StatusOK, s.dto(sb))
			return
		}
		sb.killSessions()
		sb.state, sb.next, sb.due = "destroying", "destroyed", time.Now().Add(s.opts.DeleteDelay)
		_ = os.RemoveAll(sb.dir)
		writeJSON(w, http.StatusOK, s.dto(sb))
	})
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(sb *sandbox) {
		if sb.state != "started" {
			apiError(w, http.StatusBadRequest, "Sandbox is not started")
			return
		}
		// Stopping ends every process; the disk (sb.dir) stays.
		sb.killSessions()
		sb.state, sb.next, sb.due = "stopping", "stopped", time.Now().Add(s.opts.StopDelay)
		writeJSON(w, http.StatusOK, s.dto(sb))
	})
}

func (s *Server) start(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(sb *sandbox) {
		switch sb.state {
		case "started":
		case "stopped":
			sb.state, sb.next, sb.due = "starting", "started", time.Now().Add(s.opts.StartDelay)
		default:
			apiError(w, http.StatusBadRequest, "Sandbox is not stopped")
			return
		}
		writeJSON(w, http.StatusOK, s.dto(sb))
	})
}

// list serves GET /sandbox in creation order. The cursor is the sequence
// number of the next sandbox, so deletes between pages neither repeat nor
// skip the survivors.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, ok := standin.QueryLimit(q, "limit", 100, 200)
	if !ok {
		apiError(w, http.StatusBadRequest, "limit must not be greater than 200")
		return
	}
	var from uint64
	if v := q.Get("cursor"); v != "" {
		var err error
		if from, err = standin.ParseSeqCursor(v); err != nil {
			apiError(w, http.StatusBadRequest, "Invalid cursor")
			return
		}
	}
	var labels map[string]string
	if v := q.Get("labels"); v != "" {
		if err := json.Unmarshal([]byte(v), &labels); err != nil {
			apiError(w, http.StatusBadRequest, "Invalid labels")
			return
		}
	}
	states := map[string]bool{}
	for _, st := range q["states"] {
		states[st] = true
	}
	name := q.Get("name")
	s.mu.Lock()
	var match []*sandbox
	for _, sb := range s.sandboxes {
		if !s.advance(sb) || sb.seq < from || (len(states) > 0 && !states[sb.state]) || (name != "" && sb.name != name) {
			continue
		}
		ok := true
		for k, v := range labels {
			if sb.labels[k] != v {
				ok = false
			}
		}
		if ok {
			match = append(match, sb)
		}
	}
	sort.Slice(match, func(i, j int) bool { return match[i].seq < match[j].seq })
	page := map[string]any{"nextCursor": nil}
	items := []map[string]any{}
	for i, sb := range match {
		if i == limit {
			page["nextCursor"] = standin.SeqCursor(sb.seq)
			break
		}
		items = append(items, s.dto(sb))
	}
	page["items"] = items
	s.mu.Unlock()
	s.WriteList(w, nestJSON, page)
}

func randUUID() string {
	h := standin.RandHex(16)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
