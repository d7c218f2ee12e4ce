package spritestest

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// The idle model, from the lifecycle pages (concepts/lifecycle,
// keeping-sprites-running, working-with-sprites "Idle Detection"): a
// sprite is active while an exec or TTY session is attached or a task
// (the Tasks API) is live; about 30 s after the last activity it pauses
// warm — its processes frozen in place, resumed by the next request — and
// if it stays idle it goes cold, its processes killed. A command left
// running after its exec disconnected (a detached runner-shim session) is
// not activity. Open TCP connections drop on either pause; the only TCP
// the stand-in owns is its exec WebSockets, which are activity, so none
// is open when a sprite pauses (a process's own connections are frozen
// with it, not dropped: not modelled).
//
// The Tasks API is served on a unix socket per sprite at
// <sprite>/.sprite/api.sock (the sprite's /.sprite/api.sock), virtual
// host "sprite": GET /v1/tasks, GET|PUT|DELETE /v1/tasks/{name}, POST|PUT
// /v1/tasks, expire as seconds or a duration string, at most 1 h.

// The runtime states of a sprite.
const (
	stateRunning = "running"
	stateWarm    = "warm"
	stateCold    = "cold"
)

// markerEnv is set in every command the stand-in runs, so a pause finds
// the sprite's processes even after they daemonized out of the exec's
// process group (runner-shim's session shims): every process carrying
// it, and every descendant of one.
const markerEnv = "SPRITES_STANDIN_SPRITE"

// maxTaskExpire is the Tasks API's maximum expiry.
const maxTaskExpire = time.Hour

// life is a sprite's idle bookkeeping, guarded by Server.mu.
type life struct {
	state      string
	lastActive time.Time
	pausedAt   time.Time
	tasks      map[string]task
	sock       string
	ln         net.Listener
	srv        *http.Server
}

type task struct{ started, expires time.Time }

// startTasks serves sp's Tasks API socket; the server is owned by s.wg
// and stopped by stopTasks.
func (s *Server) startTasks(sp *sprite) error {
	dir := filepath.Join(sp.dir, ".sprite")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	sp.life.sock = filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sp.life.sock)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tasks", func(w http.ResponseWriter, r *http.Request) { s.listTasks(w, sp) })
	mux.HandleFunc("GET /v1/tasks/{name}", func(w http.ResponseWriter, r *http.Request) { s.getTask(w, sp, r.PathValue("name")) })
	mux.HandleFunc("POST /v1/tasks", func(w http.ResponseWriter, r *http.Request) { s.putTask(w, r, sp, "", true) })
	mux.HandleFunc("PUT /v1/tasks", func(w http.ResponseWriter, r *http.Request) { s.putTask(w, r, sp, "", false) })
	mux.HandleFunc("PUT /v1/tasks/{name}", func(w http.ResponseWriter, r *http.Request) { s.putTask(w, r, sp, r.PathValue("name"), false) })
	mux.HandleFunc("DELETE /v1/tasks/{name}", func(w http.ResponseWriter, r *http.Request) { s.deleteTask(w, sp, r.PathValue("name")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	sp.life.ln, sp.life.srv = ln, srv
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = srv.Serve(ln)
	}()
	return nil
}

// stopTasks closes sp's Tasks API socket.
func stopTasks(sp *sprite) {
	if sp.life.srv != nil {
		_ = sp.life.srv.Close()
	}
}

func (s *Server) listTasks(w http.ResponseWriter, sp *sprite) {
	s.mu.Lock()
	now := time.Now()
	var names []string
	for n, t := range sp.life.tasks {
		if t.expires.After(now) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	out := []map[string]any{}
	for _, n := range names {
		t := sp.life.tasks[n]
		out = append(out, map[string]any{"name": n, "started_at": t.started.UTC().Format(time.RFC3339Nano), "expires_at": t.expires.UTC().Format(time.RFC3339Nano)})
	}
	s.mu.Unlock()
	standin.WriteJSON(w, http.StatusOK, map[string]any{"tasks": out})
}

func (s *Server) getTask(w http.ResponseWriter, sp *sprite, name string) {
	s.mu.Lock()
	t, ok := sp.life.tasks[name]
	ok = ok && t.expires.After(time.Now())
	s.mu.Unlock()
	if !ok {
		apiError(w, http.StatusNotFound, "not_found", "no such task")
		return
	}
	standin.WriteJSON(w, http.StatusOK, map[string]any{"name": name, "started_at": t.started.UTC().Format(time.RFC3339Nano), "expires_at": t.expires.UTC().Format(time.RFC3339Nano)})
}

// putTask serves create (POST: 201, 409 when the name is live) and upsert
// (PUT: 200).
func (s *Server) putTask(w http.ResponseWriter, r *http.Request, sp *sprite, name string, create bool) {
	var body struct {
		Name   string          `json:"name"`
		Expire json.RawMessage `json:"expire"`
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || json.Unmarshal(b, &body) != nil {
		apiError(w, http.StatusBadRequest, "invalid_request", "invalid body")
		return
	}
	if name == "" {
		name = body.Name
	}
	d, err := parseExpire(body.Expire)
	if name == "" || err != nil {
		apiError(w, http.StatusBadRequest, "invalid_request", "a name and an expire of at most 1h are required")
		return
	}
	now := time.Now()
	s.mu.Lock()
	t, live := sp.life.tasks[name]
	live = live && t.expires.After(now)
	if create && live {
		s.mu.Unlock()
		apiError(w, http.StatusConflict, "conflict", "the task exists")
		return
	}
	if !live {
		t.started = now
	}
	t.expires = now.Add(d)
	sp.life.tasks[name] = t
	sp.life.lastActive = now
	s.mu.Unlock()
	status := http.StatusOK
	if create {
		status = http.StatusCreated
	}
	standin.WriteJSON(w, status, map[string]any{"name": name, "started_at": t.started.UTC().Format(time.RFC3339Nano), "expires_at": t.expires.UTC().Format(time.RFC3339Nano)})
}

func parseExpire(raw json.RawMessage) (time.Duration, error) {
	var d time.Duration
	var n int64
	var str string
	switch {
	case json.Unmarshal(raw, &n) == nil:
		d = time.Duration(n) * time.Second
	case json.Unmarshal(raw, &str) == nil:
		var err error
		if d, err = time.ParseDuration(str); err != nil {
			return 0, err
		}
	default:
		return 0, errors.New("expire is seconds or a duration")
	}
	if d <= 0 || d > maxTaskExpire {
		return 0, errors.New("expire out of range")
	}
	return d, nil
}

func (s *Server) deleteTask(w http.ResponseWriter, sp *sprite, name string) {
	s.mu.Lock()
	t, ok := sp.life.tasks[name]
	ok = ok && t.expires.After(time.Now())
	delete(sp.life.tasks, name)
	s.mu.Unlock()
	if !ok {
		apiError(w, http.StatusNotFound, "not_found", "no such task")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// activeLocked reports whether sp has activity now. s.mu must be held.
func activeLocked(sp *sprite, now time.Time) bool {
	for _, p := range sp.procs {
		if !p.exited && p.conn != nil {
			return true
		}
	}
	for _, t := range sp.life.tasks {
		if t.expires.After(now) {
			return true
		}
	}
	return false
}

// idleLoop pauses idle sprites; owned by s.wg, it ends at shutdown.
func (s *Server) idleLoop() {
	defer s.wg.Done()
	tick := max(min(s.opts.IdleAfter, s.opts.ColdAfter)/5, 20*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
		}
		now := time.Now()
		var freeze, kill []string
		s.mu.Lock()
		for _, sp := range s.sprites {
			switch {
			case activeLocked(sp, now):
				sp.life.lastActive = now
			case sp.life.state == stateRunning && now.Sub(sp.life.lastActive) >= s.opts.IdleAfter:
				sp.life.state, sp.life.pausedAt = stateWarm, now
				s.pauses++
				freeze = append(freeze, sp.id)
			case sp.life.state == stateWarm && now.Sub(sp.life.pausedAt) >= s.opts.ColdAfter:
				sp.life.state = stateCold
				kill = append(kill, sp.id)
			}
		}
		s.mu.Unlock()
		for _, id := range freeze {
			signalSprite(id, syscall.SIGSTOP)
		}
		for _, id := range kill {
			// A cold sprite's memory is dropped: its processes die. They
			// are resumed first so the kill is not left pending on a
			// stopped process.
			signalSprite(id, syscall.SIGKILL)
			signalSprite(id, syscall.SIGCONT)
		}
	}
}

// wake resumes a paused sprite: the next request does (lifecycle: "the
// next request resumes it"). A warm sprite's processes go on where they
// were; a cold one has none left.
func (s *Server) wake(sp *sprite) {
	s.mu.Lock()
	was := sp.life.state
	sp.life.state, sp.life.lastActive = stateRunning, time.Now()
	s.mu.Unlock()
	if was == stateWarm {
		signalSprite(sp.id, syscall.SIGCONT)
	}
}

// State returns a sprite's runtime state: "running", "warm" or "cold"
// ("" for no such sprite).
func (s *Server) State(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp, ok := s.sprites[name]; ok {
		return sp.life.state
	}
	return ""
}

// Pauses returns how many times a sprite went warm.
func (s *Server) Pauses() int { s.mu.Lock(); defer s.mu.Unlock(); return s.pauses }

// Tasks returns the names of a sprite's live tasks, sorted.
func (s *Server) Tasks(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if !ok {
		return nil
	}
	var out []string
	for n, t := range sp.life.tasks {
		if t.expires.After(time.Now()) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// signalSprite sends sig to every process of the sprite: those carrying
// its marker and all their descendants.
func signalSprite(id string, sig syscall.Signal) {
	for _, pid := range spriteProcs(id) {
		_ = syscall.Kill(pid, sig)
	}
}

func spriteProcs(id string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	mark := []byte(markerEnv + "=" + id + "\x00")
	parent := map[int]int{}
	in := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			// pid (comm) state ppid …; comm may hold spaces and parens.
			if i := strings.LastIndexByte(string(st), ')'); i > 0 {
				if f := strings.Fields(string(st[i+1:])); len(f) > 1 {
					parent[pid], _ = strconv.Atoi(f[1])
				}
			}
		}
		if env, err := os.ReadFile("/proc/" + e.Name() + "/environ"); err == nil && containsEntry(env, mark) {
			in[pid] = true
		}
	}
	// Descendants: a command started with a cleared environment is still
	// below a marked process (runner-shim's session shim is its reaper).
	for changed := true; changed; {
		changed = false
		for pid, pp := range parent {
			if !in[pid] && in[pp] {
				in[pid], changed = true, true
			}
		}
	}
	out := make([]int, 0, len(in))
	for pid := range in {
		out = append(out, pid)
	}
	sort.Ints(out)
	return out
}

func containsEntry(env, entry []byte) bool {
	return strings.HasPrefix(string(env), string(entry)) || strings.Contains(string(env), "\x00"+string(entry))
}
