package spritestest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// The filesystem, lookup and network policy handlers.

// spritePath resolves an API path inside the sprite's directory; cleaning
// it as an absolute path first keeps ".." from leaving the directory.
func spritePath(sp *sprite, workingDir, p string) string {
	if !strings.HasPrefix(p, "/") {
		p = filepath.Join("/", workingDir, p)
	}
	return filepath.Join(sp.dir, filepath.Clean("/"+p))
}

// withPath calls f with the sprite the request's {name} names, under
// s.mu, and reports whether it exists; one the stand-in does not hold is
// the API's 404.
func (s *Server) withPath(w http.ResponseWriter, r *http.Request, f func(*sprite)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[r.PathValue("name")]
	if !ok {
		spriteNotFound(w)
		return false
	}
	f(sp)
	return true
}

// lookup is withPath for the calls that go on without s.mu.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*sprite, bool) {
	var sp *sprite
	ok := s.withPath(w, r, func(p *sprite) { sp = p })
	return sp, ok
}

// lookupReady is lookup for the calls that need the sprite's machine
// (exec, fs): a sprite still starting answers 503 (Options.ReadyDelay),
// and a paused one wakes.
func (s *Server) lookupReady(w http.ResponseWriter, r *http.Request) (*sprite, bool) {
	sp, ok := s.lookup(w, r)
	if !ok {
		return nil, false
	}
	s.mu.Lock()
	starting := time.Now().Before(sp.readyAt)
	s.mu.Unlock()
	if starting {
		apiError(w, http.StatusServiceUnavailable, "sprite_starting", "the sprite is starting")
		return nil, false
	}
	s.wake(sp)
	return sp, true
}

func (s *Server) fsWrite(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookupReady(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	if q.Get("path") == "" {
		apiError(w, http.StatusBadRequest, "invalid_path", "path is required")
		return
	}
	mode := os.FileMode(0o644)
	if v := q.Get("mode"); v != "" {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil || m > 0o7777 {
			apiError(w, http.StatusBadRequest, "invalid_mode", "mode must be octal")
			return
		}
		mode = os.FileMode(m)
	}
	dst := spritePath(sp, q.Get("workingDir"), q.Get("path"))
	// fs/write has no asRoot flag where chmod, chown, copy, delete and
	// rename have one (the API reference): it writes as the sprite user,
	// who owns its home and /tmp and not the system directories.
	if !userWritable(sp, dst) {
		apiError(w, http.StatusForbidden, "permission_denied", "permission denied")
		return
	}
	if r.ContentLength > MaxWriteFile {
		apiError(w, http.StatusRequestEntityTooLarge, "file_too_large", "the body exceeds 16 MiB")
		return
	}
	if q.Get("mkdirParents") == "true" || q.Get("mkdir") == "true" {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			apiError(w, http.StatusBadRequest, "mkdir_failed", "cannot create parent directories")
			return
		}
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxWriteFile+1))
	if err != nil {
		apiError(w, http.StatusBadRequest, "invalid_body", "read body")
		return
	}
	if len(data) > MaxWriteFile {
		apiError(w, http.StatusRequestEntityTooLarge, "file_too_large", "the body exceeds 16 MiB")
		return
	}
	// Write beside and rename, so a command never sees a half-written
	// binary; chmod explicitly, since the umask would mask OpenFile's mode.
	tmp := dst + ".standin-tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		apiError(w, http.StatusNotFound, "not_found", "parent directory does not exist")
		return
	}
	if err := os.Chmod(tmp, mode); err != nil || os.Rename(tmp, dst) != nil {
		_ = os.Remove(tmp)
		apiError(w, http.StatusInternalServerError, "write_failed", "write failed")
		return
	}
	standin.WriteJSON(w, http.StatusOK, map[string]any{"path": q.Get("path"), "size": len(data), "mode": fmt.Sprintf("%04o", mode.Perm())})
}

// MaxWriteFile is the largest body fs/write takes (16 MiB).
const MaxWriteFile = 16 << 20

// userWritable reports whether the sprite user may write dst: under its
// home (/home/sprite) or /tmp.
func userWritable(sp *sprite, dst string) bool {
	for _, d := range []string{"home/sprite", "tmp"} {
		root := filepath.Join(sp.dir, d)
		if dst == root || strings.HasPrefix(dst, root+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

func (s *Server) fsRead(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookupReady(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	data, err := os.ReadFile(spritePath(sp, q.Get("workingDir"), q.Get("path")))
	if err != nil {
		apiError(w, http.StatusNotFound, "file_not_found", "no such file")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(data)
}

func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookup(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	p := sp.policy
	s.mu.Unlock()
	if p == nil {
		p = json.RawMessage(`{"rules":[]}`)
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(p)
}

func (s *Server) setPolicy(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookup(w, r)
	if !ok {
		return
	}
	var p struct {
		Rules *[]struct {
			Domain  string `json:"domain"`
			Action  string `json:"action"`
			Include string `json:"include"`
		} `json:"rules"`
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || json.Unmarshal(b, &p) != nil || p.Rules == nil {
		apiError(w, http.StatusBadRequest, "invalid_policy", "rules are required")
		return
	}
	for _, rule := range *p.Rules {
		if rule.Include == "" && (rule.Domain == "" || (rule.Action != "allow" && rule.Action != "deny")) {
			apiError(w, http.StatusBadRequest, "invalid_rule", "a rule needs a domain and an action of allow or deny")
			return
		}
	}
	norm, _ := json.Marshal(p)
	s.mu.Lock()
	sp.policy = norm
	s.mu.Unlock()
	standin.WriteJSON(w, http.StatusOK, map[string]any{})
}
