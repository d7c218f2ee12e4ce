package daytonatest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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
	// deleted is closed when a DELETE has ended the session (a waiting
	// synchronous exec then answers "session cancelled").
	deleted chan struct{}
	cmds    map[string]*command
	order   []string
}

type command struct {
	id, text, dir string
	// exitCode is the code once the daemon has read it from the exit
	// code file (it caches it then, and only then does input answer 410).
	exitCode *int
}

// readExitCode reads the command's exit code file as the daemon does: no
// file is "running" (nil, nil); a file that is there but does not hold a
// number (the moment between `>>` creating it and writing the code) is the
// daemon's error.
func (c *command) readExitCode() (*int, error) {
	if c.exitCode != nil {
		return c.exitCode, nil
	}
	b, err := os.ReadFile(filepath.Join(c.dir, "exit_code"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read exit code file: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimRight(string(b), "\n"))
	if err != nil {
		return nil, fmt.Errorf("failed to convert exit code to int: %w", err)
	}
	c.exitCode = &n
	return &n, nil
}

// exitCodeRaceErr is the daemon's answer to a read of a command record
// that met the exit code file created but still empty.
var exitCodeRaceErr = fmt.Errorf("failed to convert exit code to int: %w", &strconv.NumError{Func: "Atoi", Num: "", Err: strconv.ErrSyntax})

// record reads a command's record; the caller holds s.mu. At the rate
// SetExitCodeRace set, a command whose exit code the daemon has not cached
// yet answers the race's error (the window is a few microseconds on the
// real daemon, so it is forced here to be met at all).
func (s *Server) record(c *command) (map[string]any, error) {
	if c.exitCode == nil && s.raceRate > 0 && rand.Float64() < s.raceRate {
		s.races++
		return nil, exitCodeRaceErr
	}
	ec, err := c.readExitCode()
	if err != nil {
		return nil, err
	}
	m := map[string]any{"id": c.id, "command": c.text, "suppressInputEcho": false}
	if ec != nil {
		m["exitCode"] = *ec
	}
	return m, nil
}

// killSessions ends every process of the sandbox, as a stopped or
// deleted sandbox's VM takes them with it: every session's process group,
// then what left the groups (runner-shim's detached sessions), found by
// TagEnv. The caller holds s.mu. The shells' waiters (owned by s.wg) reap
// them.
func (sb *sandbox) killSessions() {
	for _, ss := range sb.sessions {
		_ = syscall.Kill(-ss.shell.Process.Pid, syscall.SIGKILL)
		ss.stdin.Close()
	}
	sb.sessions = map[string]*session{}
	standin.KillTagged(TagEnv, sb.id)
}

// The daemon's three shapes of an error answer (common-go's error
// middleware behind gin):
//
//   - typedError: a typed error (NewNotFoundError, ...) reaching the
//     middleware as it is: its status, its prefixed message, a code;
//   - defaultError: any other error (a typed one a handler wrapped with
//     fmt.Errorf): 500, the message, a zero timestamp and an empty path;
//   - abort: gin's AbortWithError: the status and no body at all.
func typedError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	codes := map[int]string{
		http.StatusBadRequest: "BAD_REQUEST", http.StatusNotFound: "NOT_FOUND", http.StatusConflict: "CONFLICT",
		http.StatusGone: "GONE", http.StatusRequestTimeout: "REQUEST_TIMEOUT", http.StatusInternalServerError: "INTERNAL_SERVER_ERROR",
	}
	code := codes[status]
	if status == http.StatusBadRequest && strings.HasPrefix(msg, "invalid body request: ") {
		code = "INVALID_REQUEST_BODY"
	}
	// The middleware sets the type before gin renders, so gin's own
	// "; charset=utf-8" is not added.
	w.Header().Set("Content-Type", "application/json")
	writeJSON(w, status, map[string]any{
		"statusCode": status, "message": msg, "code": code,
		"timestamp": time.Now().UTC().Format(time.RFC3339Nano), "path": r.URL.Path, "method": r.Method,
	})
}

func defaultError(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "application/json")
	writeJSON(w, http.StatusInternalServerError, map[string]any{
		"statusCode": http.StatusInternalServerError, "message": msg, "timestamp": "0001-01-01T00:00:00Z", "path": "",
	})
}

func abort(w http.ResponseWriter, status int) { w.WriteHeader(status) }

// notFoundRoute is gin's answer for a route it does not have.
func notFoundRoute(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusNotFound)
	_, _ = io.WriteString(w, "404 page not found")
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
	if !standin.Bearer(s.APIKey)(r) {
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
	// The daemon sees the path without the proxy's prefix (its error
	// bodies name it).
	r = r.Clone(r.Context())
	r.URL.Path = path
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
		notFoundRoute(w)
	}
}

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

// wrapper is what the session shell is fed for one command, written from
// the daemon's behaviour (pkg/session execute.go): FIFOs for the
// command's stdout, stderr and stdin; a line-reading loop per output
// stream that prefixes each line with its marker and appends it to the
// log; a stdin holder (async: a loop of `sleep 3600` writing to the stdin
// FIFO, whose sleep outlives the loop's kill and stays until the session
// goes; sync: an immediate EOF); the command file SOURCED in the session's
// own shell, so `exit` ends the session and cd and variables carry over;
// then, once both loops drained, the exit code APPENDED to its file with
// `>>` (which creates it empty first). A trap removes the FIFOs on exit.
// The placeholders are replaced.
const wrapper = `{
_d=@DIR@
_o="$_d/stdout.pipe"; _e="$_d/stderr.pipe"; _i=@INPUT@
rm -f "$_o" "$_e" "$_i" && mkfifo "$_o" "$_e" "$_i" || exit 1
trap 'rm -f "$_o" "$_e" "$_i"' EXIT HUP INT TERM
( while IFS= read -r l || [ -n "$l" ]; do printf '\001\001\001%s\n' "$l"; done < "$_o" ) >> @LOG@ & _r1=$!
( while IFS= read -r l || [ -n "$l" ]; do printf '\002\002\002%s\n' "$l"; done < "$_e" ) >> @LOG@ & _r2=$!
@HOLDER@
_h=$!
{ . @CMDFILE@; } < "$_i" > "$_o" 2> "$_e"
_c=$?
kill "$_h" 2>/dev/null; wait "$_h" 2>/dev/null
wait "$_r1" "$_r2"
echo "$_c" >> @EXIT@
rm -f "$_o" "$_e" "$_i"
}
`

// shellQuote is s as one double-quoted shell word (the daemon uses Go's
// %q, which the shell reads the same for these plain paths).
func shellQuote(s string) string { return strconv.Quote(s) }

func (s *Server) exec(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	var req struct {
		Command  string `json:"command"`
		RunAsync bool   `json:"runAsync"`
		Async    bool   `json:"async"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || strings.TrimSpace(req.Command) == "" {
		// The handler's AbortWithError: a status and no body.
		abort(w, http.StatusBadRequest)
		return
	}
	async := req.RunAsync || req.Async
	format := logFormat(r.Header)
	s.mu.Lock()
	ss, ok := sb.sessions[sid]
	if !ok {
		s.mu.Unlock()
		// The service's NotFoundError, wrapped by the handler: a 500.
		defaultError(w, "failed to execute command: not found: session not found")
		return
	}
	c := &command{id: randUUID(), text: req.Command}
	c.dir = filepath.Join(ss.dir, c.id)
	fail := func(msg string, err error) {
		s.mu.Unlock()
		defaultError(w, "failed to execute command: bad request: "+msg+": "+err.Error())
	}
	ss.cmds[c.id] = c
	ss.order = append(ss.order, c.id)
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		fail("failed to create log directory", err)
		return
	}
	logPath := filepath.Join(c.dir, "output.log")
	if err := os.WriteFile(logPath, nil, 0o666); err != nil {
		fail("failed to create log file", err)
		return
	}
	cmdFile := filepath.Join(c.dir, "cmd.sh")
	if err := os.WriteFile(cmdFile, []byte(req.Command), 0o600); err != nil {
		fail("failed to write command file", err)
		return
	}
	holder := `cat /dev/null > "$_i" &`
	if async {
		holder = `while :; do sleep 3600; done > "$_i" &`
	}
	script := strings.NewReplacer("@DIR@", shellQuote(c.dir), "@INPUT@", shellQuote(filepath.Join(c.dir, "input.pipe")),
		"@LOG@", shellQuote(logPath), "@HOLDER@", holder, "@CMDFILE@", shellQuote(cmdFile),
		"@EXIT@", shellQuote(filepath.Join(c.dir, "exit_code"))).Replace(wrapper)
	if _, err := io.WriteString(ss.stdin, script); err != nil {
		// A shell that exited (`exit` in an earlier command, a kill):
		// its stdin pipe is broken.
		fail("failed to write command", err)
		return
	}
	deleted := ss.deleted
	s.mu.Unlock()
	if async {
		writeJSON(w, http.StatusAccepted, map[string]any{"cmdId": c.id, "output": nil, "stdout": nil, "stderr": nil, "exitCode": nil})
		return
	}
	// Synchronous: poll the exit code file every 50 ms, for ever (a shell
	// that died never writes it) unless the session is deleted.
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		ec, err := c.readExitCode()
		s.mu.Unlock()
		if err != nil {
			defaultError(w, "failed to execute command: bad request: "+err.Error())
			return
		}
		if ec != nil {
			b, _ := os.ReadFile(logPath)
			out := map[string]any{"cmdId": c.id, "output": nil, "stdout": nil, "stderr": nil, "exitCode": *ec}
			switch format {
			case formatCombined:
				out["output"] = string(stripMarkers(b))
			case formatJSON:
				o, e := demux(b)
				out["output"], out["stdout"], out["stderr"] = string(b), string(o), string(e)
			default:
				out["output"] = string(b)
			}
			writeJSON(w, http.StatusOK, out)
			return
		}
		select {
		case <-deleted:
			defaultError(w, "failed to execute command: bad request: session cancelled")
			return
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lookupCommand returns a command; the caller holds s.mu.
func lookupCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) (*session, *command, bool) {
	ss, ok := lookupSession(w, r, sb, sid)
	if !ok {
		return nil, nil, false
	}
	c, ok := ss.cmds[cid]
	if !ok {
		typedError(w, r, http.StatusNotFound, "not found: command not found")
	}
	return ss, c, ok
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, c, ok := lookupCommand(w, r, sb, sid, cid)
	if !ok {
		return
	}
	m, err := s.record(c)
	if err != nil {
		defaultError(w, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) input(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	var req struct {
		Data string `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Data == "" {
		typedError(w, r, http.StatusBadRequest, "invalid body request: Key: 'SessionSendInputRequest.Data' Error:Field validation for 'Data' failed on the 'required' tag")
		return
	}
	s.mu.Lock()
	_, c, ok := lookupCommand(w, r, sb, sid, cid)
	var ec *int
	if ok {
		ec = c.exitCode
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	// Only an exit code the daemon has already read makes it 410.
	if ec != nil {
		typedError(w, r, http.StatusGone, "gone: command has already completed with exit code "+strconv.Itoa(*ec))
		return
	}
	data := req.Data
	if !strings.HasSuffix(data, "\n") {
		data += "\n"
	}
	// A blocking open and write, with no deadline, as the daemon's: the
	// open waits for the command to open its stdin, the write for room in
	// the pipe. Only the stand-in's shutdown releases them.
	pipe := filepath.Join(c.dir, "input.pipe")
	if err := s.writeFIFO(pipe, data); err != nil {
		typedError(w, r, http.StatusInternalServerError, "internal server error: "+err.Error())
		return
	}
	// The daemon echoes the input into the log as stdout.
	if lf, err := os.OpenFile(filepath.Join(c.dir, "output.log"), os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
		_, _ = lf.Write(append(append([]byte{}, stdoutMarker...), data...))
		lf.Close()
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeFIFO opens path for writing, blocking, and writes data. The stand-in's
// shutdown unblocks a waiting open by opening the FIFO's read side itself
// (the killed command no longer will); the goroutine doing so is this
// call's, and the call waits for it.
func (s *Server) writeFIFO(path, data string) error {
	done := make(chan struct{})
	released := make(chan struct{})
	go func() {
		defer close(released)
		select {
		case <-done:
		case <-s.ctx.Done():
			if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		}
	}()
	defer func() { close(done); <-released }()
	f, err := os.OpenFile(path, os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("failed to open input pipe: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		return fmt.Errorf("failed to write to input pipe: %w", err)
	}
	return nil
}
