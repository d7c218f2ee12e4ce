package daytonatest

// The toolbox's session endpoints: create (a real shell), list, get and
// delete (SIGTERM to the tree, SIGKILL after the grace), and the process
// tree walk delete uses.

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.SessionID == "" {
		typedError(w, r, http.StatusBadRequest, "invalid body request: Key: 'CreateSessionRequest.SessionId' Error:Field validation for 'SessionId' failed on the 'required' tag")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := sb.sessions[req.SessionID]; ok {
		typedError(w, r, http.StatusConflict, "conflict: session already exists")
		return
	}
	dir := filepath.Join(sb.dir, "daemon", "sessions", req.SessionID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		defaultError(w, err.Error())
		return
	}
	sh := exec.Command(s.shell())
	sh.Dir = filepath.Join(sb.dir, "home")
	sh.Env = append(os.Environ(), "HOME="+sh.Dir, TagEnv+"="+sb.id)
	for k, v := range sb.env {
		sh.Env = append(sh.Env, k+"="+v)
	}
	// Its own process group, so deleting the session or stopping the
	// sandbox ends every process it started.
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A pipe of its own rather than StdinPipe: Wait would close the write
	// side, and the daemon never waits for a live session's shell, so a
	// write after the shell died fails as "broken pipe" there.
	pr, stdin, err := os.Pipe()
	if err != nil {
		defaultError(w, err.Error())
		return
	}
	sh.Stdin = pr
	err = sh.Start()
	pr.Close()
	if err != nil {
		stdin.Close()
		defaultError(w, err.Error())
		return
	}
	ss := &session{id: req.SessionID, dir: dir, shell: sh, stdin: stdin, done: make(chan struct{}),
		deleted: make(chan struct{}), cmds: map[string]*command{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = sh.Wait()
		close(ss.done)
	}()
	sb.sessions[req.SessionID] = ss
	w.WriteHeader(http.StatusCreated)
}

// lookupSession returns a session; the caller holds s.mu.
func lookupSession(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) (*session, bool) {
	ss, ok := sb.sessions[sid]
	if !ok {
		typedError(w, r, http.StatusNotFound, "not found: session not found")
	}
	return ss, ok
}

// records renders a session's commands; the caller holds s.mu.
func (s *Server) records(ss *session) ([]map[string]any, error) {
	cmds := []map[string]any{}
	for _, id := range ss.order {
		m, err := s.record(ss.cmds[id])
		if err != nil {
			return nil, err
		}
		cmds = append(cmds, m)
	}
	return cmds, nil
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, ss := range sb.sessions {
		cmds, err := s.records(ss)
		if err != nil {
			defaultError(w, err.Error())
			return
		}
		out = append(out, map[string]any{"sessionId": ss.id, "commands": cmds})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := lookupSession(w, r, sb, sid)
	if !ok {
		return
	}
	cmds, err := s.records(ss)
	if err != nil {
		defaultError(w, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessionId": sid, "commands": cmds})
}

// deleteSession ends a session as the daemon does: SIGTERM to the shell's
// process group and to every descendant found by walking the process tree
// (what left the group with setsid), then a check every
// Options.TerminationCheck (first after one interval) until the shell is
// gone or has no children; after Options.TerminationGrace, SIGKILL to the
// group, the tree and the shell. Only then is the session removed and
// the answer sent: a DELETE costs at least one check interval.
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	s.mu.Lock()
	ss, ok := lookupSession(w, r, sb, sid)
	s.mu.Unlock()
	if !ok {
		return
	}
	pid := ss.shell.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	signalTree(pid, syscall.SIGTERM)
	if !s.waitTerminated(pid) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		signalTree(pid, syscall.SIGKILL)
		_ = ss.shell.Process.Kill()
	}
	s.mu.Lock()
	if sb.sessions[sid] == ss {
		delete(sb.sessions, sid)
		close(ss.deleted)
		ss.stdin.Close()
	}
	s.mu.Unlock()
	_ = os.RemoveAll(ss.dir)
	w.WriteHeader(http.StatusNoContent)
}

// waitTerminated polls as the daemon's waitForTermination does: true once
// the shell is gone or childless, false when the grace ran out.
func (s *Server) waitTerminated(pid int) bool {
	grace := time.NewTimer(s.opts.TerminationGrace)
	defer grace.Stop()
	t := time.NewTicker(s.opts.TerminationCheck)
	defer t.Stop()
	for {
		select {
		case <-grace.C:
			return false
		case <-s.ctx.Done():
			return false
		case <-t.C:
			if !exists(pid) || len(children(pid)) == 0 {
				return true
			}
		}
	}
}

// exists reports whether pid is a process that has not been reaped.
func exists(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

// children returns the pids whose parent is pid, from /proc.
func children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(st, ')')
		f := strings.Fields(string(st[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// signalTree signals every descendant of pid, deepest first.
func signalTree(pid int, sig syscall.Signal) {
	for _, c := range children(pid) {
		signalTree(c, sig)
		_ = syscall.Kill(c, sig)
	}
}
