// Package spritestest is a stand-in for the Sprites API, written from the
// public spec, for tests: an httptest server with the control plane
// (POST/GET/PUT/DELETE /v1/sprites[/{name}], the paged list, fs/write and
// fs/read, the network policy, checkpoints) and the exec WebSocket, which runs REAL
// processes, each sprite in its own directory under t.TempDir().
//
// It reproduces the behaviours a client must survive:
//
//   - the exit frame's payload is ONE byte (stream 3): a code above 255
//     wraps, a signal death is 128+n;
//   - about 30 % of fast commands end with a close of status 1000 and no
//     exit frame ([DropExitRandom], or [DropExitAlways] deterministically);
//   - a non-TTY command is killed (its process group, or its process tree
//     under Options.KillTree; SIGKILL) 10 s after its WebSocket
//     disconnects (Options.DisconnectGrace shortens it for tests) unless max_run_after_disconnect says otherwise; a TTY command
//     runs on by default;
//   - the stdin EOF frame (stream 4) closes the command's stdin; in TTY
//     mode binary messages are raw terminal bytes and the exit is the JSON
//     exit message;
//   - fs/write stores the body with the requested mode and creates parent
//     directories with mkdirParents;
//   - a duplicate create answers 409 (or 400, Options.DuplicateStatus);
//   - the socket is held Options.CloseHold (5 s) after the exit byte before
//     the server closes it or answers a close (hold.go);
//   - a non-TTY exec gets the JSON exit message at its reap, before the
//     output still in its pipes, and the binary exit frame last;
//   - with Options.LoseOutput, fast commands also lose their whole output
//     or get it replayed with stderr merged, capped at [ReplayCap];
//   - fs/write writes as the sprite user (403 outside /home/sprite and
//     /tmp) and takes at most 16 MiB; max_results is 1..500;
//   - a sprite pauses Options.IdleAfter (30 s) after its last attached
//     exec or task, warm (processes frozen) then cold (killed), with the
//     Tasks API on its /.sprite/api.sock (idle.go);
//   - a new or restored sprite answers 503 for Options.ReadyDelay;
//   - checkpoints and restore (checkpoint.go), the URL settings, and
//     WebSocket pings (counted).
//
// And the faults, on demand: an outage (503 everywhere), a proxy that drops
// connections, a proxy answering 502, a proxy's bare 404, a list body cut
// mid-page (InterruptList), 429 with Retry-After, and execs that run to
// their end but lose their output and exit frame (CutExecs: a call that
// took effect whose answer never arrived).
//
// The network policy is stored and returned, never enforced: an egress
// probe against the stand-in fails, as it must for an unproven policy.
// Output produced while no client is attached is discarded (the real
// service keeps a scrollback for attach, which is not modelled), and
// attach (WSS /exec/{id}) is not modelled; the session list and the kill
// endpoint (NDJSON progress) are.
//
// The stand-in shares no code with package sprites (its own frame and JSON
// handling), so a framing mistake in one cannot hide in the other.
package spritestest

import (
	"encoding/base64"
	"encoding/json"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// DropExitMode says when the stand-in ends an exec without its exit frame.
type DropExitMode int

const (
	// DropExitNever always sends the exit frame (the default).
	DropExitNever DropExitMode = iota
	// DropExitAlways ends every exec with a close of status 1000 and no
	// exit frame: the deterministic switch for tests.
	DropExitAlways
	// DropExitRandom drops the exit frame of a fast command (one that ran
	// less than Options.FastCommand) with probability Options.DropRate, as
	// measured on Sprites (about 30 %).
	DropExitRandom
)

// Options configures a stand-in. The zero value is usable.
type Options struct {
	// DisconnectGrace is how long a non-TTY command runs after its
	// WebSocket disconnects when the client sent no
	// max_run_after_disconnect; 0 means Sprites' 10 s.
	DisconnectGrace time.Duration
	// DropExit is the initial missing-exit-frame mode (SetDropExit).
	DropExit DropExitMode
	// DropRate is DropExitRandom's probability; 0 means 0.3.
	DropRate float64
	// FastCommand is what DropExitRandom calls fast; 0 means 1 s.
	FastCommand time.Duration
	// Seed seeds DropExitRandom, so a run can be repeated.
	Seed uint64
	// DuplicateStatus is the answer to a create of an existing name: 409
	// (the default) or 400.
	DuplicateStatus int
	// NoSignalCapability leaves "signal" out of X-Sprite-Capabilities.
	NoSignalCapability bool
	// Dir holds the sprites' directories; "" means t.TempDir(). A short
	// one keeps the unix socket paths of a runner-shim inside a sprite
	// within their 107 bytes.
	Dir string
	// CloseHold is how long an exec's socket stays open after its exit
	// byte before the server closes it or answers the client's close
	// handshake; 0 means Sprites' 5 s (sprites-py #24, #26; sprites-js
	// #16), negative closes at once.
	CloseHold time.Duration
	// NoTextExit leaves out the JSON exit message a non-TTY exec gets
	// before its last output and its binary exit frame (the asyncapi's
	// ExitMessage, seen first by a field capture). Default: sent.
	NoTextExit bool
	// LoseOutput makes DropExitRandom also lose output: a fast command's
	// whole output (sprites-py #16: zero data messages and no exit), or
	// its output replayed with stderr merged into stdout and capped at
	// 64 KiB (a field capture), each about as often as a plain missing
	// exit frame.
	LoseOutput bool
	// ReplayFast replays every fast command's output, stderr merged into
	// stdout and capped at ReplayCap (the field capture's behaviour, made
	// deterministic).
	ReplayFast bool
	// IdleAfter is how long a sprite without activity (an attached exec,
	// a live task) runs before it pauses warm, its processes frozen; 0
	// means Sprites' "about 30 seconds", negative never pauses (idle.go).
	IdleAfter time.Duration
	// ReadyDelay is how long a new or restored sprite refuses execs and
	// fs calls (503) before it takes them. How the real service refuses
	// them is not documented ("a following sprite exec automatically
	// retries while the Sprite is still coming back up", the checkpoints
	// page): 503 is this stand-in's model. 0: ready at once.
	ReadyDelay time.Duration
	// ColdAfter is how long a warm sprite stays warm before it goes cold,
	// its processes killed; 0 means 5 minutes (Sprites says only "long
	// enough").
	ColdAfter time.Duration
	// KillTree makes the kill after max_run_after_disconnect reach the
	// exec's whole process tree (every descendant found by parent links
	// in /proc, as a reaper that follows descendants would) instead of
	// its process group. Sprites' kill endpoint speaks of the "process
	// group"; what the disconnect kill reaches is not documented, so
	// runner-shim's sessions are tested under both.
	KillTree bool
	// MissingExit is how the exec of a program that does not exist ends,
	// after its message on stderr: that exit code, 0 meaning 127 (a
	// shell's status, this stand-in's guess: the real one is not
	// documented), or, negative, no exit frame at all.
	MissingExit int
}

// ReplayCap is the most a replayed fast command's output holds (a field
// capture: 64 KiB).
const ReplayCap = 64 << 10

// Server is the stand-in. Its methods are safe for concurrent use. New
// registers its shutdown with t.Cleanup: every process it started is
// killed and waited for, every goroutine stopped.
type Server struct {
	// Faults are the switches in front of the API.
	*standin.Faults
	srv *httptest.Server
	// Token is the only Bearer token the API accepts.
	Token string
	// Org is the organization slug of every sprite.
	Org string

	opts    Options
	root    string
	closing chan struct{}
	wg      sync.WaitGroup // process waiters, pumps and disconnect timers

	mu         sync.Mutex // guards everything below and every sprite's and proc's fields
	sprites    map[string]*sprite
	conns      map[*websocket.Conn]bool
	rng        *mrand.Rand
	dropExit   DropExitMode
	proxy502   bool
	proxy404   bool
	cuts       map[string]int // CutExecs: argv word → execs left to cut
	dropped    int            // execs closed without their exit frame
	lostOutput int            // fast execs whose output was lost or replayed
	pings      int            // WebSocket pings received
	pauses     int            // warm pauses so far
}

type sprite struct {
	id, name    string
	dir         string
	created     time.Time
	updated     time.Time
	labels      []string
	auth        string
	policy      json.RawMessage
	procs       map[int]*proc
	life        life
	readyAt     time.Time // execs and fs calls before it answer 503
	checkpoints []checkpoint
}

// New starts a stand-in for t.
func New(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.DisconnectGrace <= 0 {
		opts.DisconnectGrace = 10 * time.Second
	}
	if opts.DropRate <= 0 {
		opts.DropRate = 0.3
	}
	if opts.FastCommand <= 0 {
		opts.FastCommand = time.Second
	}
	if opts.DuplicateStatus == 0 {
		opts.DuplicateStatus = http.StatusConflict
	}
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	switch {
	case opts.IdleAfter == 0:
		opts.IdleAfter = 30 * time.Second
	case opts.IdleAfter < 0:
		opts.IdleAfter = 0
	}
	if opts.ColdAfter <= 0 {
		opts.ColdAfter = 5 * time.Minute
	}
	switch {
	case opts.CloseHold == 0:
		opts.CloseHold = 5 * time.Second
	case opts.CloseHold < 0:
		opts.CloseHold = 0
	}
	s := &Server{
		Token:    "sprites_" + standin.RandHex(20),
		Org:      "stand-in",
		opts:     opts,
		root:     opts.Dir,
		closing:  make(chan struct{}),
		sprites:  map[string]*sprite{},
		conns:    map[*websocket.Conn]bool{},
		rng:      mrand.New(mrand.NewPCG(opts.Seed, opts.Seed^0x5bd1e995)),
		dropExit: opts.DropExit,
		cuts:     map[string]int{},
	}
	s.Faults = &standin.Faults{Extra: s.proxyFault, RateLimited: func(w http.ResponseWriter, ra time.Duration) {
		standin.WriteJSON(w, http.StatusTooManyRequests, map[string]any{
			"error": "rate_limited", "message": "too many requests", "retry_after_seconds": int(ra / time.Second),
		})
	}}
	s.srv = httptest.NewUnstartedServer(s.Wrap("api", true, s.mux()))
	s.srv.Listener = holdListener{Listener: s.srv.Listener, closing: s.closing}
	s.srv.Config.ConnContext = connContext
	s.srv.Start()
	if opts.IdleAfter > 0 {
		s.wg.Add(1)
		go s.idleLoop()
	}
	t.Cleanup(s.shutdown)
	return s
}

// URL is the API's base URL (Config.BaseURL).
func (s *Server) URL() string { return s.srv.URL }

// SetProxyError makes every request answer 502 with an HTML body while
// on, as Fly's proxy does for a machine it cannot reach.
func (s *Server) SetProxyError(on bool) { s.mu.Lock(); s.proxy502 = on; s.mu.Unlock() }

// SetProxyNotFound makes every request answer a bare 404 (text, not the
// API's JSON) while on: a 404 that proves nothing.
func (s *Server) SetProxyNotFound(on bool) { s.mu.Lock(); s.proxy404 = on; s.mu.Unlock() }

// CutExecs makes the next n execs whose argv has word as one of its
// elements run to their end with their output and their exit frame
// dropped, closed with status 1000: a call that took effect but whose
// answer never arrived (a connection lost at the worst moment).
func (s *Server) CutExecs(word string, n int) { s.mu.Lock(); s.cuts[word] = n; s.mu.Unlock() }

// DroppedExits returns how many execs ended with a close and no exit
// frame so far (the quirk and CutExecs), so a test can show it met them.
func (s *Server) DroppedExits() int { s.mu.Lock(); defer s.mu.Unlock(); return s.dropped }

// LostOutputs returns how many fast execs lost their output or had it
// replayed merged and capped (Options.LoseOutput).
func (s *Server) LostOutputs() int { s.mu.Lock(); defer s.mu.Unlock(); return s.lostOutput }

// Pings returns how many WebSocket pings the exec endpoints received.
func (s *Server) Pings() int { s.mu.Lock(); defer s.mu.Unlock(); return s.pings }

// SetDropExit switches the missing-exit-frame quirk.
func (s *Server) SetDropExit(m DropExitMode) { s.mu.Lock(); s.dropExit = m; s.mu.Unlock() }

// Dir returns a sprite's directory (its "/" for fs calls and the default
// working directory of its commands) and whether the sprite exists.
func (s *Server) Dir(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if !ok {
		return "", false
	}
	return sp.dir, true
}

// Running returns the pids of the sprite's commands that have not exited,
// in ascending order.
func (s *Server) Running(name string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if !ok {
		return nil
	}
	var pids []int
	for pid, p := range sp.procs {
		if !p.exited {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

func (s *Server) shutdown() {
	s.mu.Lock()
	close(s.closing)
	for _, sp := range s.sprites {
		for _, p := range sp.procs {
			p.killLocked()
		}
		stopTasks(sp)
		if sp.life.state == stateWarm {
			signalSprite(sp.id, syscall.SIGKILL)
			signalSprite(sp.id, syscall.SIGCONT)
		}
	}
	for c := range s.conns {
		_ = c.CloseNow()
	}
	s.mu.Unlock()
	s.srv.Close()
	s.wg.Wait()
}

func (s *Server) mux() http.Handler {
	return standin.API(standin.Bearer(s.Token), func(w http.ResponseWriter, _ *http.Request) {
		apiError(w, http.StatusUnauthorized, "unauthorized", "Missing or invalid authentication")
	}, standin.Routes{
		"POST /v1/sprites":                                 s.create,
		"GET /v1/sprites":                                  s.list,
		"GET /v1/sprites/{name}":                           s.get,
		"DELETE /v1/sprites/{name}":                        s.delete,
		"PUT /v1/sprites/{name}":                           s.update,
		"POST /v1/sprites/{name}/checkpoint":               s.createCheckpoint,
		"GET /v1/sprites/{name}/checkpoints":               s.listCheckpoints,
		"GET /v1/sprites/{name}/checkpoints/{id}":          s.getCheckpoint,
		"POST /v1/sprites/{name}/checkpoints/{id}/restore": s.restoreCheckpoint,
		"PUT /v1/sprites/{name}/fs/write":                  s.fsWrite,
		"GET /v1/sprites/{name}/fs/read":                   s.fsRead,
		"GET /v1/sprites/{name}/policy/network":            s.getPolicy,
		"POST /v1/sprites/{name}/policy/network":           s.setPolicy,
		"GET /v1/sprites/{name}/exec":                      s.exec,
		"POST /v1/sprites/{name}/exec/{id}/kill":           s.kill,
	})
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	standin.WriteJSON(w, status, map[string]any{"error": code, "message": msg})
}

// spriteNotFound is the API's definitive answer.
func spriteNotFound(w http.ResponseWriter) {
	standin.WriteJSON(w, http.StatusNotFound, map[string]any{"error": "sprite not found"})
}

// validName is the stand-in's rule for sprite names (lowercase letters,
// digits and dashes, 1..63, starting with a letter or digit).
var validName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name        *string `json:"name"`
		URLSettings *struct {
			Auth string `json:"auth"`
		} `json:"url_settings"`
		Labels []string `json:"labels"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid_request", "invalid request body")
		return
	}
	if req.Name == nil || !validName.MatchString(*req.Name) {
		apiError(w, http.StatusBadRequest, "invalid_name", "name must be 1-63 lowercase letters, digits or dashes")
		return
	}
	auth := "sprite"
	if req.URLSettings != nil && req.URLSettings.Auth != "" {
		if req.URLSettings.Auth != "sprite" && req.URLSettings.Auth != "public" {
			apiError(w, http.StatusBadRequest, "invalid_url_settings", "auth must be sprite or public")
			return
		}
		auth = req.URLSettings.Auth
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sprites[*req.Name]; ok {
		apiError(w, s.opts.DuplicateStatus, "sprite_exists", "a sprite with this name already exists")
		return
	}
	dir := filepath.Join(s.root, *req.Name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		apiError(w, http.StatusInternalServerError, "internal", "create sprite directory")
		return
	}
	for _, d := range []string{"home/sprite", "tmp"} {
		_ = os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	now := time.Now().UTC()
	sp := &sprite{id: "sprite-" + randUUID(), name: *req.Name, dir: dir, created: now, updated: now,
		labels: req.Labels, auth: auth, procs: map[int]*proc{},
		life: life{state: stateRunning, lastActive: now, tasks: map[string]task{}}, readyAt: now.Add(s.opts.ReadyDelay)}
	if err := s.startTasks(sp); err != nil {
		_ = os.RemoveAll(dir)
		apiError(w, http.StatusInternalServerError, "internal", "start the tasks socket")
		return
	}
	s.sprites[sp.name] = sp
	standin.WriteJSON(w, http.StatusCreated, s.view(sp))
}

func (s *Server) view(sp *sprite) map[string]any {
	status := sp.life.state
	return map[string]any{
		"id": sp.id, "name": sp.name, "organization": s.Org,
		"url":          "https://" + sp.name + "-standin.sprites.app",
		"url_settings": map[string]any{"auth": sp.auth},
		"status":       status,
		"created_at":   sp.created.Format(time.RFC3339Nano), "updated_at": sp.updated.Format(time.RFC3339Nano),
		"last_started_at": nil, "last_active_at": nil,
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.withPath(w, r, func(sp *sprite) { standin.WriteJSON(w, http.StatusOK, s.view(sp)) })
}

// update serves PUT /v1/sprites/{name}: url_settings.auth ("sprite" or
// "public") is the one setting (the API reference, "Update Sprite").
func (s *Server) update(w http.ResponseWriter, r *http.Request) {
	var req struct {
		URLSettings *struct {
			Auth string `json:"auth"`
		} `json:"url_settings"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.URLSettings == nil ||
		(req.URLSettings.Auth != "sprite" && req.URLSettings.Auth != "public") {
		apiError(w, http.StatusBadRequest, "invalid_request", "url_settings.auth must be sprite or public")
		return
	}
	s.withPath(w, r, func(sp *sprite) {
		sp.auth = req.URLSettings.Auth
		sp.updated = time.Now().UTC()
		standin.WriteJSON(w, http.StatusOK, s.view(sp))
	})
}

// URLAuth returns a sprite's url_settings.auth ("" for no such sprite).
func (s *Server) URLAuth(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp, ok := s.sprites[name]; ok {
		return sp.auth
	}
	return ""
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	sp, ok := s.sprites[r.PathValue("name")]
	if ok {
		delete(s.sprites, sp.name)
		for _, p := range sp.procs {
			p.killLocked()
		}
		stopTasks(sp)
	}
	s.mu.Unlock()
	if ok {
		// Every process of the sprite, daemons and frozen ones included.
		signalSprite(sp.id, syscall.SIGKILL)
		signalSprite(sp.id, syscall.SIGCONT)
	}
	if !ok {
		spriteNotFound(w)
		return
	}
	_ = os.RemoveAll(sp.dir)
	_ = os.RemoveAll(filepath.Join(s.root, ".checkpoints", sp.id))
	w.WriteHeader(http.StatusNoContent)
}

// list pages in name order; the continuation token is the last name of
// the page, encoded so that clients treat it as opaque.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, ok := standin.QueryLimit(q, "max_results", 50, 500)
	if !ok {
		apiError(w, http.StatusBadRequest, "invalid_max_results", "max_results must be 1-500")
		return
	}
	after := ""
	if tok := q.Get("continuation_token"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || !strings.HasPrefix(string(b), "after:") {
			apiError(w, http.StatusBadRequest, "invalid_continuation_token", "bad continuation token")
			return
		}
		after = strings.TrimPrefix(string(b), "after:")
	}
	prefix := q.Get("prefix")
	s.mu.Lock()
	var names []string
	for n := range s.sprites {
		if strings.HasPrefix(n, prefix) && n > after {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	more := len(names) > limit
	if more {
		names = names[:limit]
	}
	entries := []map[string]any{}
	for _, n := range names {
		sp := s.sprites[n]
		v := s.view(sp)
		entries = append(entries, map[string]any{
			"name": n, "org_slug": s.Org, "id": sp.id, "status": v["status"], "url": v["url"],
			"updated_at": sp.updated.Format(time.RFC3339Nano),
		})
	}
	s.mu.Unlock()
	body := map[string]any{"sprites": entries, "has_more": more}
	if more {
		body["next_continuation_token"] = base64.RawURLEncoding.EncodeToString([]byte("after:" + names[len(names)-1]))
	}
	s.WriteList(w, "", body)
}

// proxyFault answers the Fly proxy's own faults (SetProxyError,
// SetProxyNotFound), which take no rate-limit turn.
func (s *Server) proxyFault(w http.ResponseWriter, _ *http.Request) bool {
	s.mu.Lock()
	p502, p404 := s.proxy502, s.proxy404
	s.mu.Unlock()
	switch {
	case p502:
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
	case p404:
		http.Error(w, "404 page not found", http.StatusNotFound)
	default:
		return false
	}
	return true
}

func randUUID() string {
	h := standin.RandHex(16)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
