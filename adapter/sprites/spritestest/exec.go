package spritestest

import (
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
	"sync"
	"syscall"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
	"github.com/coder/websocket"
)

// The stream ids of the exec protocol (the first byte of a non-TTY binary
// message), spelled here independently of package sprites.
const (
	sidStdin    = 0
	sidStdout   = 1
	sidStderr   = 2
	sidExit     = 3
	sidStdinEOF = 4
)

// proc is one exec'd command. Its mutable fields are guarded by Server.mu.
type proc struct {
	s       *Server
	sp      *sprite
	pid     int
	tty     bool
	argv    []string
	started time.Time
	cmd     *exec.Cmd
	stdin   io.WriteCloser // the stdin pipe (nil without stdin) or the PTY master
	master  *os.File       // TTY only
	pumps   []func()       // output copiers, started by run
	closers []io.Closer    // the pipe ends to close once the pumps are done
	// grace is how long the command runs once detached; 0 is forever.
	grace  time.Duration
	conn   *websocket.Conn // the attached client, nil when detached
	timer  *time.Timer     // the pending kill after a disconnect
	exited bool
	code   int
	done   chan struct{} // closed once the exit is recorded
	// cut drops every output byte and the exit frame (CutExecs).
	cut bool
	// hold is the connection's close hold (nil for a test's own dialer).
	hold *holdConn
	// reaped is closed once the command is reaped; textSent once the
	// non-TTY JSON exit message went out (or will not).
	reaped, textSent chan struct{}
	ws               syscall.WaitStatus // set before reaped is closed
	// dropExit is decided at the reap: the exit frame (and the JSON exit
	// message) will not be sent.
	dropExit bool

	// wmu orders this command's writes to its client: a chunk, the
	// buffered output, the exit. Taken before Server.mu, never inside it.
	wmu sync.Mutex
	// buffering holds output in pending while the command may still turn
	// out fast (Options.LoseOutput), until flush sends it live.
	buffering bool
	pending   []chunk
	flush     *time.Timer
}

// chunk is one output message held back: its stream id (-1 raw TTY
// bytes) and its bytes.
type chunk struct {
	sid  int
	data []byte
}

func (c chunk) msg() []byte {
	if c.sid < 0 {
		return c.data
	}
	return append([]byte{byte(c.sid)}, c.data...)
}

// killLocked kills the command's process group, or its process tree
// under Options.KillTree. s.mu must be held.
func (p *proc) killLocked() {
	if p.exited || p.cmd == nil || p.cmd.Process == nil {
		return
	}
	if p.s.opts.KillTree {
		killTree(p.pid)
		return
	}
	// The group id is the pid: Setpgid (pipes) or Setsid (TTY).
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
}

// execQuery is the parsed query of WSS /v1/sprites/{name}/exec.
type execQuery struct {
	argv       []string
	path, dir  string
	env        []string
	tty, stdin bool
	rows, cols uint16
	grace      time.Duration
	graceSet   bool
}

func parseExecQuery(r *http.Request) (execQuery, string) {
	q := r.URL.Query()
	e := execQuery{argv: q["cmd"], path: q.Get("path"), dir: q.Get("dir"), env: q["env"]}
	if len(e.argv) == 0 || e.argv[0] == "" {
		return e, "cmd is required"
	}
	if e.path == "" {
		e.path = e.argv[0]
	}
	var err error
	if v := q.Get("tty"); v != "" {
		if e.tty, err = strconv.ParseBool(v); err != nil {
			return e, "tty must be a bool"
		}
	}
	// stdin defaults to true with a TTY, false without.
	e.stdin = e.tty
	if v := q.Get("stdin"); v != "" {
		if e.stdin, err = strconv.ParseBool(v); err != nil {
			return e, "stdin must be a bool"
		}
	}
	e.rows, e.cols = 24, 80
	for _, f := range []struct {
		key string
		dst *uint16
	}{{"rows", &e.rows}, {"cols", &e.cols}} {
		if v := q.Get(f.key); v != "" {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return e, f.key + " must be a non-negative integer"
			}
			*f.dst = uint16(n)
		}
	}
	if v := q.Get("max_run_after_disconnect"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			n, nerr := strconv.Atoi(v)
			if nerr != nil {
				return e, "max_run_after_disconnect must be a duration"
			}
			d = time.Duration(n) * time.Second
		}
		if d < 0 {
			return e, "max_run_after_disconnect must not be negative"
		}
		e.grace, e.graceSet = d, true
	}
	for _, kv := range e.env {
		if !strings.Contains(kv, "=") {
			return e, "env entries are KEY=VALUE"
		}
	}
	return e, ""
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	// The same path lists the sessions when it is not an upgrade.
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		if sp, ok := s.lookup(w, r); ok {
			s.listSessions(w, sp)
		}
		return
	}
	sp, ok := s.lookupReady(w, r)
	if !ok {
		return
	}
	eq, bad := parseExecQuery(r)
	if bad != "" {
		apiError(w, http.StatusBadRequest, "bad_request", bad)
		return
	}
	if !s.opts.NoSignalCapability {
		w.Header().Set("X-Sprite-Capabilities", "signal")
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{OnPingReceived: func(context.Context, []byte) bool {
		s.mu.Lock()
		s.pings++
		s.mu.Unlock()
		return true
	}})
	if err != nil {
		return
	}
	conn.SetReadLimit(4 << 20)
	s.mu.Lock()
	select {
	case <-s.closing:
		s.mu.Unlock()
		_ = conn.CloseNow()
		return
	default:
	}
	s.conns[conn] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
	}()

	p := &proc{s: s, sp: sp, tty: eq.tty, argv: eq.argv, started: time.Now(), conn: conn, done: make(chan struct{}),
		hold: holdOf(r.Context()), reaped: make(chan struct{}), textSent: make(chan struct{}),
		buffering: s.opts.LoseOutput || s.opts.ReplayFast}
	s.mu.Lock()
	for _, a := range eq.argv {
		if s.cuts[a] > 0 {
			s.cuts[a]--
			p.cut = true
			break
		}
	}
	s.mu.Unlock()
	switch {
	case eq.graceSet:
		p.grace = eq.grace
	case eq.tty:
		p.grace = 0 // a TTY command runs on forever by default
	default:
		p.grace = s.opts.DisconnectGrace
	}
	ctx := r.Context()
	if err := s.startProc(p, eq); err != nil {
		// A command that cannot start is an exit, as a shell reports it:
		// 127 for a missing program, 126 for one that cannot run.
		s.failStart(ctx, conn, eq.tty, err)
		return
	}
	// Rows and cols describe a terminal: zero without one.
	rows, cols := uint16(0), uint16(0)
	if eq.tty {
		rows, cols = eq.rows, eq.cols
	}
	info, _ := json.Marshal(map[string]any{
		"type": "session_info", "session_id": strconv.Itoa(p.pid), "command": strings.Join(eq.argv, " "),
		"created": p.started.Unix(), "cols": cols, "rows": rows, "is_owner": true, "tty": eq.tty,
	})
	_ = conn.Write(ctx, websocket.MessageText, info)
	// Output flows only after session_info, which is always first.
	s.run(p)
	s.readLoop(ctx, p, conn)
}

// startProc starts the command; run starts its pumps and waiter.
func (s *Server) startProc(p *proc, eq execQuery) error {
	path := eq.path
	// An absolute path that exists inside the sprite (runner-shim uploaded
	// with fs/write) runs from there; other paths are the host's (/bin/sh).
	if filepath.IsAbs(path) {
		if fi, err := os.Stat(filepath.Join(p.sp.dir, path)); err == nil && !fi.IsDir() {
			path = filepath.Join(p.sp.dir, path)
		}
	}
	cmd := exec.Command(path)
	cmd.Args = eq.argv
	cmd.Dir = p.sp.dir
	if eq.dir != "" {
		cmd.Dir = spritePath(p.sp, "/", eq.dir)
	}
	cmd.Env = eq.env
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + p.sp.dir}
		if eq.tty {
			cmd.Env = append(cmd.Env, "TERM=xterm")
		}
	}
	// The stand-in's bookkeeping, not Sprites': how a pause finds the
	// sprite's processes (idle.go).
	cmd.Env = append(cmd.Env[:len(cmd.Env):len(cmd.Env)], markerEnv+"="+p.sp.id)
	var pumps []func()
	if eq.tty {
		master, slave, err := standin.OpenPTY(eq.rows, eq.cols)
		if err != nil {
			return err
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			master.Close()
			slave.Close()
			return err
		}
		// The child holds the slave now; the master reads EIO once every
		// holder of the slave is gone.
		slave.Close()
		p.master, p.stdin = master, master
		pumps = append(pumps, func() { s.pump(p, master, -1) })
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return err
		}
		if eq.stdin {
			in, err := cmd.StdinPipe()
			if err != nil {
				return err
			}
			p.stdin = in
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		pumps = append(pumps, func() { s.pump(p, stdout, sidStdout) }, func() { s.pump(p, stderr, sidStderr) })
		p.closers = append(p.closers, stdout, stderr)
		if p.stdin != nil {
			p.closers = append(p.closers, p.stdin)
		}
	}
	p.cmd, p.pid, p.pumps = cmd, cmd.Process.Pid, pumps
	s.mu.Lock()
	p.sp.procs[p.pid] = p
	s.mu.Unlock()
	return nil
}

func (s *Server) failStart(ctx context.Context, conn *websocket.Conn, tty bool, err error) {
	code := 1
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
		code = 127
		if s.opts.MissingExit != 0 {
			code = s.opts.MissingExit
		}
	case errors.Is(err, os.ErrPermission):
		code = 126
	}
	msg := []byte("exec: " + err.Error() + "\n")
	if tty {
		_ = conn.Write(ctx, websocket.MessageBinary, msg)
	} else {
		_ = conn.Write(ctx, websocket.MessageBinary, append([]byte{sidStderr}, msg...))
	}
	s.mu.Lock()
	drop := s.dropExit == DropExitAlways
	if drop {
		s.dropped++
	}
	drop = drop || code < 0 // Options.MissingExit: no exit frame
	s.mu.Unlock()
	s.sendExit(ctx, conn, holdOf(ctx), tty, code, drop)
}

// readLoop serves the client's frames until it disconnects or the exit
// closes the connection, then detaches: a command still running gets its
// grace before the kill.
func (s *Server) readLoop(ctx context.Context, p *proc, conn *websocket.Conn) {
	defer s.detach(p, conn)
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageText {
			s.control(p, msg)
			continue
		}
		if p.tty {
			_, _ = p.stdin.Write(msg)
			continue
		}
		if len(msg) == 0 || p.stdin == nil {
			continue
		}
		switch msg[0] {
		case sidStdin:
			// A write after the command closed its stdin fails; the client
			// learns of the exit from the exit frame.
			_, _ = p.stdin.Write(msg[1:])
		case sidStdinEOF:
			_ = p.stdin.Close()
		}
	}
}

func (s *Server) control(p *proc, msg []byte) {
	var m struct {
		Type       string `json:"type"`
		Rows, Cols uint16
		Signal     string `json:"signal"`
	}
	if json.Unmarshal(msg, &m) != nil {
		return
	}
	switch m.Type {
	case "resize":
		if p.master != nil && m.Rows > 0 && m.Cols > 0 {
			_ = standin.SetPTYSize(p.master, m.Rows, m.Cols)
		}
	case "signal":
		if s.opts.NoSignalCapability {
			return
		}
		sig, ok := signalNames[strings.TrimPrefix(m.Signal, "SIG")]
		if !ok {
			return
		}
		s.mu.Lock()
		if !p.exited {
			_ = syscall.Kill(-p.pid, sig)
		}
		s.mu.Unlock()
	}
}

func (s *Server) detach(p *proc, conn *websocket.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.conn != conn {
		return // the exit already took the connection
	}
	p.conn = nil
	_ = conn.CloseNow()
	if p.exited || p.grace == 0 {
		return
	}
	p.timer = time.AfterFunc(p.grace, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		p.killLocked()
	})
}

// signalNames maps the API's signal names, with or without "SIG".
var signalNames = map[string]syscall.Signal{
	"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "HUP": syscall.SIGHUP, "KILL": syscall.SIGKILL,
	"QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
}

func (s *Server) listSessions(w http.ResponseWriter, sp *sprite) {
	s.mu.Lock()
	sessions := []map[string]any{}
	for pid, p := range sp.procs {
		if p.exited {
			continue
		}
		// The shape sprites-go's ListSessions reads (session.go, types.go
		// Session): id (a number here), command, workdir, created,
		// bytes_per_second, is_active, last_activity, tty.
		sessions = append(sessions, map[string]any{
			"id": pid, "command": strings.Join(p.argv, " "), "workdir": "/" + strings.TrimPrefix(strings.TrimPrefix(p.cmd.Dir, sp.dir), "/"),
			"created": p.started.UTC().Format(time.RFC3339), "bytes_per_second": 0.0,
			"is_active": p.conn != nil, "last_activity": p.started.UTC().Format(time.RFC3339), "tty": p.tty,
		})
	}
	s.mu.Unlock()
	standin.WriteJSON(w, http.StatusOK, map[string]any{"sessions": sessions})
}

// kill serves POST /v1/sprites/{name}/exec/{id}/kill: NDJSON progress
// (signal, then exited or timeout and killed, then complete with the exit
// code). timeout=0s sends the signal and ends the stream.
func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	sp, ok := s.lookup(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	name := strings.TrimPrefix(q.Get("signal"), "SIG")
	if name == "" {
		name = "TERM"
	}
	sig, ok := signalNames[name]
	if !ok {
		apiError(w, http.StatusBadRequest, "invalid_signal", "unknown signal")
		return
	}
	wait := 10 * time.Second
	if v := q.Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			apiError(w, http.StatusBadRequest, "invalid_timeout", "timeout must be a duration")
			return
		}
		wait = d
	}
	pid, _ := strconv.Atoi(r.PathValue("id"))
	s.mu.Lock()
	p, ok := sp.procs[pid]
	exited := ok && p.exited
	if ok && !exited {
		_ = syscall.Kill(-p.pid, sig)
	}
	s.mu.Unlock()
	switch {
	case !ok:
		apiError(w, http.StatusNotFound, "session not found", "no such exec session")
		return
	case exited:
		apiError(w, http.StatusGone, "session_exited", "the session already exited")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	_ = enc.Encode(map[string]any{"type": "signal", "message": "Signaling SIG" + name + " to process group " + strconv.Itoa(pid), "signal": "SIG" + name, "pid": pid})
	flush()
	if wait == 0 {
		return
	}
	select {
	case <-p.done:
		_ = enc.Encode(map[string]any{"type": "exited", "message": "Process exited"})
	case <-time.After(wait):
		_ = enc.Encode(map[string]any{"type": "timeout", "message": "Timed out waiting for exit"})
		s.mu.Lock()
		p.killLocked()
		s.mu.Unlock()
		select {
		case <-p.done:
		case <-s.closing:
			return
		}
		_ = enc.Encode(map[string]any{"type": "killed", "message": "Process killed"})
	case <-s.closing:
		return
	case <-r.Context().Done():
		return
	}
	s.mu.Lock()
	code := p.code
	s.mu.Unlock()
	_ = enc.Encode(map[string]any{"type": "complete", "exit_code": code})
}
