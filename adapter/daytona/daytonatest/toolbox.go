package daytonatest

// The toolbox daemon stand-in: its sessions' and commands' state, the
// daemon's error shapes, and serveToolbox, which routes each request to
// sessions.go, commands.go, files.go or logs.go.

import (
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
