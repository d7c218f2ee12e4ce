package daytonatest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

// The stream markers of the daemon's session log.
var (
	stdoutMarker = []byte{1, 1, 1}
	stderrMarker = []byte{2, 2, 2}
)

type session struct {
	id    string
	dir   string
	shell *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when the shell has been reaped
	cmds  map[string]*command
	order []string
}

type command struct {
	id, text, dir string
}

// exitCode reads the command's exit code file: nil while it runs.
func (c *command) exitCode() *int {
	b, err := os.ReadFile(filepath.Join(c.dir, "exit_code"))
	if err != nil {
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil
	}
	return &n
}

func (c *command) record() map[string]any {
	m := map[string]any{"id": c.id, "command": c.text}
	if ec := c.exitCode(); ec != nil {
		m["exitCode"] = *ec
	}
	return m
}

// killSessions ends every process of the sandbox, as a stopped or
// deleted sandbox's VM takes them with it: every session's process group,
// then what left the groups (runner-shim's detached sessions), found by
// TagEnv. The caller holds s.mu. The shells' waiters (owned by s.wg) reap
// them.
func (sb *sandbox) killSessions() {
	for _, ss := range sb.sessions {
		_ = syscall.Kill(-ss.shell.Process.Pid, syscall.SIGKILL)
	}
	sb.sessions = map[string]*session{}
	standin.KillTagged(TagEnv, sb.id)
}

// daemonError writes the toolbox daemon's error body (common-go).
func daemonError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	code := strings.ToUpper(strings.ReplaceAll(http.StatusText(status), " ", "_"))
	writeJSON(w, status, map[string]any{
		"statusCode": status, "message": msg, "code": code,
		"timestamp": time.Now().UTC().Format(time.RFC3339), "path": r.URL.Path, "method": r.Method,
	})
}

// serveToolbox is the toolbox proxy: /toolbox/{sandboxID}/<daemon path>.
// It checks the key and that the sandbox is started, as the proxy does,
// then hands the request to the daemon.
func (s *Server) serveToolbox(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/toolbox/")
	if !ok {
		http.Error(w, "404 page not found", http.StatusNotFound)
		return
	}
	id, path, _ := strings.Cut(rest, "/")
	path = "/" + path
	if r.Header.Get("Authorization") != "Bearer "+s.APIKey {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	if ok {
		ok = s.advance(sb) && sb.state == "started"
	}
	s.mu.Unlock()
	if !ok {
		// The proxy cannot reach a sandbox that is not running: a bare
		// gateway error, not the daemon's body.
		http.Error(w, "502 Bad Gateway", http.StatusBadGateway)
		return
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case r.Method == http.MethodPost && path == "/process/execute":
		s.execute(w, r, sb)
	case r.Method == http.MethodGet && path == "/process/session":
		s.listSessions(w, r, sb)
	case r.Method == http.MethodPost && path == "/process/session":
		s.createSession(w, r, sb)
	case r.Method == http.MethodPost && path == "/files/upload":
		s.upload(w, r, sb)
	case r.Method == http.MethodGet && path == "/files/download":
		s.download(w, r, sb)
	case len(parts) == 3 && parts[1] == "session" && r.Method == http.MethodGet:
		s.getSession(w, r, sb, parts[2])
	case len(parts) == 3 && parts[1] == "session" && r.Method == http.MethodDelete:
		s.deleteSession(w, r, sb, parts[2])
	case len(parts) == 4 && parts[1] == "session" && parts[3] == "exec" && r.Method == http.MethodPost:
		s.exec(w, r, sb, parts[2])
	case len(parts) == 5 && parts[1] == "session" && parts[3] == "command" && r.Method == http.MethodGet:
		s.getCommand(w, r, sb, parts[2], parts[4])
	case len(parts) == 6 && parts[1] == "session" && parts[3] == "command" && parts[5] == "logs" && r.Method == http.MethodGet:
		s.logs(w, r, sb, parts[2], parts[4])
	case len(parts) == 6 && parts[1] == "session" && parts[3] == "command" && parts[5] == "input" && r.Method == http.MethodPost:
		s.input(w, r, sb, parts[2], parts[4])
	default:
		daemonError(w, r, http.StatusNotFound, "route not found")
	}
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.SessionID == "" || strings.ContainsAny(req.SessionID, "/.") {
		daemonError(w, r, http.StatusBadRequest, "invalid request body")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := sb.sessions[req.SessionID]; ok {
		daemonError(w, r, http.StatusConflict, "session already exists")
		return
	}
	dir := filepath.Join(sb.dir, "daemon", "sessions", req.SessionID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		daemonError(w, r, http.StatusInternalServerError, "create session directory")
		return
	}
	sh := exec.Command("bash")
	sh.Dir = filepath.Join(sb.dir, "home")
	sh.Env = append(os.Environ(), "HOME="+sh.Dir, TagEnv+"="+sb.id)
	for k, v := range sb.env {
		sh.Env = append(sh.Env, k+"="+v)
	}
	// Its own process group, so deleting the session or stopping the
	// sandbox ends every process it started.
	sh.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := sh.StdinPipe()
	if err == nil {
		err = sh.Start()
	}
	if err != nil {
		daemonError(w, r, http.StatusInternalServerError, "start session shell")
		return
	}
	ss := &session{id: req.SessionID, dir: dir, shell: sh, stdin: stdin, done: make(chan struct{}), cmds: map[string]*command{}}
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
		daemonError(w, r, http.StatusNotFound, "session not found")
	}
	return ss, ok
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, ss := range sb.sessions {
		cmds := []map[string]any{}
		for _, id := range ss.order {
			cmds = append(cmds, ss.cmds[id].record())
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
	cmds := []map[string]any{}
	for _, id := range ss.order {
		cmds = append(cmds, ss.cmds[id].record())
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessionId": sid, "commands": cmds})
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := lookupSession(w, r, sb, sid)
	if !ok {
		return
	}
	_ = syscall.Kill(-ss.shell.Process.Pid, syscall.SIGKILL)
	delete(sb.sessions, sid)
	_ = os.RemoveAll(ss.dir)
	w.WriteHeader(http.StatusNoContent)
}

// wrapper is what the session shell runs for one command: the command in a
// subshell whose stdout and stderr go through FIFOs into line-reading
// loops that prefix each line with its stream's marker and append it to
// one log; its stdin is a FIFO a sleeping writer holds open (so the
// command never sees EOF); the exit code is written once both loops have
// drained. @DIR@ and @CMD@ are replaced.
const wrapper = `{
d='@DIR@'
o="$d/stdout.pipe"; e="$d/stderr.pipe"; i="$d/input.pipe"
mkfifo "$o" "$e" "$i"
( while IFS= read -r l || [ -n "$l" ]; do printf '\001\001\001%s\n' "$l"; done < "$o" ) >> "$d/output.log" &
lo=$!
( while IFS= read -r l || [ -n "$l" ]; do printf '\002\002\002%s\n' "$l"; done < "$e" ) >> "$d/output.log" &
le=$!
sleep 2147483647 > "$i" &
h=$!
(
@CMD@
) < "$i" > "$o" 2> "$e"
c=$?
kill "$h" 2>/dev/null
wait "$lo" "$le"
echo "$c" > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
rm -f "$o" "$e" "$i"
}
`

func (s *Server) exec(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	var req struct {
		Command  string `json:"command"`
		RunAsync bool   `json:"runAsync"`
		Async    bool   `json:"async"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		daemonError(w, r, http.StatusBadRequest, "invalid request body")
		return
	}
	if strings.TrimSpace(req.Command) == "" {
		daemonError(w, r, http.StatusBadRequest, "command cannot be empty")
		return
	}
	s.mu.Lock()
	ss, ok := lookupSession(w, r, sb, sid)
	if !ok {
		s.mu.Unlock()
		return
	}
	c := &command{id: randUUID(), text: req.Command}
	c.dir = filepath.Join(ss.dir, c.id)
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		s.mu.Unlock()
		daemonError(w, r, http.StatusBadRequest, "failed to create log directory")
		return
	}
	if err := os.WriteFile(filepath.Join(c.dir, "output.log"), nil, 0o600); err != nil {
		s.mu.Unlock()
		daemonError(w, r, http.StatusBadRequest, "failed to create log file")
		return
	}
	script := strings.NewReplacer("@DIR@", c.dir, "@CMD@", req.Command).Replace(wrapper)
	if _, err := io.WriteString(ss.stdin, script); err != nil {
		s.mu.Unlock()
		daemonError(w, r, http.StatusBadRequest, "failed to write command")
		return
	}
	ss.cmds[c.id] = c
	ss.order = append(ss.order, c.id)
	done := ss.done
	s.mu.Unlock()
	if req.RunAsync || req.Async {
		writeJSON(w, http.StatusAccepted, map[string]any{"cmdId": c.id})
		return
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if ec := c.exitCode(); ec != nil {
			out := readLog(c, false)
			writeJSON(w, http.StatusOK, map[string]any{"cmdId": c.id, "output": string(out), "exitCode": *ec})
			return
		}
		select {
		case <-done:
			daemonError(w, r, http.StatusBadRequest, "session cancelled")
			return
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

// lookupCommand returns a command; the caller holds s.mu.
func lookupCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) (*command, bool) {
	ss, ok := lookupSession(w, r, sb, sid)
	if !ok {
		return nil, false
	}
	c, ok := ss.cmds[cid]
	if !ok {
		daemonError(w, r, http.StatusNotFound, "command not found")
	}
	return c, ok
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := lookupCommand(w, r, sb, sid, cid); ok {
		writeJSON(w, http.StatusOK, c.record())
	}
}

// readLog returns the command's log, its markers kept (split) or every
// marker sequence removed.
func readLog(c *command, split bool) []byte {
	b, _ := os.ReadFile(filepath.Join(c.dir, "output.log"))
	if !split {
		b = bytes.ReplaceAll(bytes.ReplaceAll(b, stdoutMarker, nil), stderrMarker, nil)
	}
	return b
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	s.mu.Lock()
	c, ok := lookupCommand(w, r, sb, sid, cid)
	s.mu.Unlock()
	if !ok {
		return
	}
	if r.URL.Query().Get("follow") == "true" {
		// Follow is a WebSocket upgrade on the daemon; the stand-in serves
		// only the HTTP log.
		daemonError(w, r, http.StatusBadRequest, "follow needs a websocket upgrade")
		return
	}
	b := validUTF8(readLog(c, r.Header.Get("X-Daytona-Split-Output") == "true"))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// validUTF8 replaces every byte of an invalid UTF-8 sequence with U+FFFD,
// as encoding/json does to a Go string.
func validUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

func (s *Server) input(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	var req struct {
		Data *string `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Data == nil {
		daemonError(w, r, http.StatusBadRequest, "invalid request body")
		return
	}
	s.mu.Lock()
	c, ok := lookupCommand(w, r, sb, sid, cid)
	s.mu.Unlock()
	if !ok {
		return
	}
	if ec := c.exitCode(); ec != nil {
		daemonError(w, r, http.StatusGone, "command has already completed with exit code "+strconv.Itoa(*ec))
		return
	}
	data := *req.Data
	if !strings.HasSuffix(data, "\n") {
		data += "\n"
	}
	// Non-blocking, so a FIFO with no reader (the command has not opened
	// it yet, or is gone) fails instead of hanging the handler, and the
	// write is bounded by a deadline.
	f, err := os.OpenFile(filepath.Join(c.dir, "input.pipe"), os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		daemonError(w, r, http.StatusInternalServerError, "failed to open input pipe")
		return
	}
	defer f.Close()
	_ = f.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := f.WriteString(data); err != nil {
		daemonError(w, r, http.StatusInternalServerError, "failed to write to input pipe")
		return
	}
	// The daemon echoes the input into the log as stdout.
	if lf, err := os.OpenFile(filepath.Join(c.dir, "output.log"), os.O_APPEND|os.O_WRONLY, 0); err == nil {
		_, _ = lf.Write(append(append([]byte{}, stdoutMarker...), data...))
		lf.Close()
	}
	w.WriteHeader(http.StatusNoContent)
}

// splitCommand splits on spaces honouring single and double quotes,
// without escapes, as the daemon's execute does; no shell runs.
func splitCommand(cmd string) []string {
	var args []string
	var cur strings.Builder
	var quote rune
	have := false
	for _, r := range cmd {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote == 0 && (r == '"' || r == '\''):
			quote, have = r, true
		case quote == 0 && r == ' ':
			if have || cur.Len() > 0 {
				args = append(args, cur.String())
			}
			cur.Reset()
			have = false
		default:
			cur.WriteRune(r)
		}
	}
	if have || cur.Len() > 0 {
		args = append(args, cur.String())
	}
	return args
}

// resolve maps a path in the sandbox to the stand-in's disk: relative to
// the home directory, or absolute inside the sandbox's directory (the
// stand-in has no root filesystem of its own).
func resolve(sb *sandbox, p string) (string, bool) {
	home := filepath.Join(sb.dir, "home")
	if p == "" {
		return home, true
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(home, p)
	}
	p = filepath.Clean(p)
	return p, p == sb.dir || strings.HasPrefix(p, sb.dir+string(filepath.Separator))
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		Command string            `json:"command"`
		Cwd     string            `json:"cwd"`
		Envs    map[string]string `json:"envs"`
		Timeout *int              `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		daemonError(w, r, http.StatusBadRequest, "command is required")
		return
	}
	argv := splitCommand(req.Command)
	if len(argv) == 0 {
		daemonError(w, r, http.StatusBadRequest, "empty command")
		return
	}
	dir, ok := resolve(sb, req.Cwd)
	if !ok {
		daemonError(w, r, http.StatusBadRequest, "cwd outside the sandbox")
		return
	}
	timeout := 360 * time.Second
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = time.Duration(*req.Timeout) * time.Second
	}
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(sb.dir, "home"), TagEnv+"="+sb.id)
	for k, v := range sb.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range req.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		daemonError(w, r, http.StatusRequestTimeout, "command execution timeout")
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": cmd.ProcessState.ExitCode(), "result": string(out)})
	case errors.As(err, &ee):
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": ee.ExitCode(), "result": string(out)})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": -1, "result": string(out)})
	}
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := resolve(sb, r.URL.Query().Get("path"))
	if !ok || r.URL.Query().Get("path") == "" {
		daemonError(w, r, http.StatusBadRequest, "invalid path")
		return
	}
	f, _, err := r.FormFile("file")
	if err != nil {
		daemonError(w, r, http.StatusBadRequest, "file is required")
		return
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		daemonError(w, r, http.StatusBadRequest, "create parent directory")
		return
	}
	out, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		daemonError(w, r, http.StatusBadRequest, "create file")
		return
	}
	_, err = io.Copy(out, f)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		daemonError(w, r, http.StatusInternalServerError, "write file")
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) download(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := resolve(sb, r.URL.Query().Get("path"))
	if !ok {
		daemonError(w, r, http.StatusBadRequest, "invalid path")
		return
	}
	b, err := os.ReadFile(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		daemonError(w, r, http.StatusNotFound, "file not found")
	case err != nil:
		daemonError(w, r, http.StatusBadRequest, "read file")
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
	}
}
