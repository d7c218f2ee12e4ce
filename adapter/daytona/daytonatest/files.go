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
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// shell picks the shell of sessions and of /process/execute as the
// daemon's GetShell does: the first of /usr/bin/zsh, /bin/zsh,
// /usr/bin/bash, /bin/bash that the shells file (Options.ShellsFile)
// names on a line not commented out, else $SHELL, else sh.
func (s *Server) shell() string {
	b, err := os.ReadFile(s.opts.ShellsFile)
	if err == nil {
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if l != "" && l[0] != '#' {
				lines = append(lines, l)
			}
		}
		listed := strings.Join(lines, "\n")
		for _, sh := range []string{"/usr/bin/zsh", "/bin/zsh", "/usr/bin/bash", "/bin/bash"} {
			if strings.Contains(listed, sh) {
				return sh
			}
		}
	}
	if err != nil {
		return "sh"
	}
	if sh, ok := os.LookupEnv("SHELL"); ok {
		return sh
	}
	return "sh"
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

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// execute is POST /process/execute: the command is the shell's stdin (a
// shell runs it: a missing program is the shell's 127 and message), stdout
// and stderr merged; a timeout only when one is given (then the process
// group is killed and the answer is 408); a process that cannot start
// (a missing cwd) is exit code -1 with Go's error as the result.
func (s *Server) execute(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		Command string            `json:"command"`
		Cwd     *string           `json:"cwd"`
		Envs    map[string]string `json:"envs"`
		Timeout *uint32           `json:"timeout"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		typedError(w, r, http.StatusBadRequest, "bad request: invalid request body: "+err.Error())
		return
	}
	if strings.TrimSpace(req.Command) == "" {
		typedError(w, r, http.StatusBadRequest, "bad request: command cannot be empty or whitespace-only")
		return
	}
	for k := range req.Envs {
		if !envKey.MatchString(k) {
			typedError(w, r, http.StatusBadRequest, "bad request: invalid environment variable name: '"+k+"'")
			return
		}
	}
	cmd := exec.Command(s.shell())
	cmd.Stdin = strings.NewReader(req.Command)
	cmd.Dir = filepath.Join(sb.dir, "home")
	if req.Cwd != nil {
		dir, ok := resolve(sb, *req.Cwd)
		if !ok {
			// Outside the stand-in's disk: a directory that is not there.
			dir = filepath.Join(sb.dir, "no-such-directory")
		}
		cmd.Dir = dir
	}
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(sb.dir, "home"), TagEnv+"="+sb.id)
	for k, v := range sb.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range req.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": -1, "result": err.Error()})
		return
	}
	var timedOut atomic.Bool
	if req.Timeout != nil && *req.Timeout > 0 {
		t := time.AfterFunc(time.Duration(*req.Timeout)*time.Second, func() {
			timedOut.Store(true)
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		})
		defer t.Stop()
	}
	// The stand-in's shutdown ends what the daemon would leave running.
	stop := context.AfterFunc(s.ctx, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer stop()
	err := cmd.Wait()
	var ee *exec.ExitError
	switch {
	case timedOut.Load():
		typedError(w, r, http.StatusRequestTimeout, "request timeout: command execution timeout")
	case err == nil || errors.As(err, &ee):
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": cmd.ProcessState.ExitCode(), "result": out.String()})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": -1, "result": out.String()})
	}
}

// queryPath resolves the request's path parameter: none is the daemon's
// bare 400; one outside the stand-in's disk answers outside (what the
// daemon answers for a path it cannot use there).
func queryPath(w http.ResponseWriter, r *http.Request, sb *sandbox, outside int) (string, bool) {
	q := r.URL.Query().Get("path")
	if q == "" {
		abort(w, http.StatusBadRequest)
		return "", false
	}
	p, ok := resolve(sb, q)
	if !ok {
		abort(w, outside)
	}
	return p, ok
}

// upload is POST /files/upload: every failure is gin's AbortWithError (a
// 400 and no body); parent directories are created 0750 and the file
// with os.Create's mode, as gin's SaveUploadedFile does.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	defer func() { _, _ = io.Copy(io.Discard, r.Body) }()
	p, ok := queryPath(w, r, sb, http.StatusBadRequest)
	if !ok {
		return
	}
	f, _, err := r.FormFile("file")
	if err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	out, err := os.Create(p)
	if err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	_, err = io.Copy(out, f)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// download is GET /files/download: a missing path is 404 and a directory
// 400, with no body (AbortWithError).
func (s *Server) download(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	p, ok := queryPath(w, r, sb, http.StatusNotFound)
	if !ok {
		return
	}
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		abort(w, http.StatusNotFound)
		return
	case errors.Is(err, os.ErrPermission):
		abort(w, http.StatusForbidden)
		return
	case err != nil || fi.IsDir():
		abort(w, http.StatusBadRequest)
		return
	}
	b, err := os.ReadFile(p)
	if err != nil {
		abort(w, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+filepath.Base(p)+`"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
