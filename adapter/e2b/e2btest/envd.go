package e2btest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT

	envdPort = "49983"
)

type ptySize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type selector struct {
	PID *uint32 `json:"pid"`
	Tag *string `json:"tag"`
}

type processInput struct {
	Stdin []byte `json:"stdin"`
	PTY   []byte `json:"pty"`
}

// connectErr is a Connect error the handlers return.
type connectErr struct{ code, msg string }

func (e *connectErr) Error() string { return e.code + ": " + e.msg }

func cerr(code, format string, a ...any) *connectErr {
	return &connectErr{code, fmt.Sprintf(format, a...)}
}

// httpStatus is the Connect protocol's code-to-status table.
func httpStatus(code string) int {
	switch code {
	case "canceled":
		return 499
	case "invalid_argument", "failed_precondition", "out_of_range":
		return http.StatusBadRequest
	case "deadline_exceeded":
		return http.StatusGatewayTimeout
	case "not_found":
		return http.StatusNotFound
	case "already_exists", "aborted":
		return http.StatusConflict
	case "permission_denied":
		return http.StatusForbidden
	case "resource_exhausted":
		return http.StatusTooManyRequests
	case "unimplemented":
		return http.StatusNotImplemented
	case "unavailable":
		return http.StatusServiceUnavailable
	case "unauthenticated":
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

func writeUnaryError(w http.ResponseWriter, e *connectErr) {
	b, _ := json.Marshal(map[string]string{"code": e.code, "message": e.msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(e.code))
	_, _ = w.Write(b)
}

// envelope frames one message: flags, big-endian uint32 length, message.
func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:5], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

func readEnvelope(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > 4<<20 || h[0] != 0 {
		return 0, nil, errors.New("bad envelope")
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return 0, nil, err
	}
	return h[0], msg, nil
}

func endStream(e *connectErr) []byte {
	m := map[string]any{}
	if e != nil {
		m["error"] = map[string]string{"code": e.code, "message": e.msg}
	}
	b, _ := json.Marshal(m)
	return envelope(0x02, b)
}

func hasType(r *http.Request, want string) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == want
}

// serveEnvd is E2B's sandbox proxy in front of each sandbox's envd.
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	sb, ok := s.sandboxes[r.Header.Get("E2b-Sandbox-Id")]
	running := ok && sb.state == "running"
	var gone chan struct{}
	var token string
	if ok {
		gone, token = sb.gone, sb.token
	}
	s.mu.Unlock()
	// The proxy, not envd, answers for a sandbox it cannot reach: 502.
	if !running || r.Header.Get("E2b-Sandbox-Port") != envdPort {
		http.Error(w, "The sandbox was not found or is not running", http.StatusBadGateway)
		return
	}
	if r.Header.Get("X-Access-Token") != token {
		writeUnaryError(w, cerr("unauthenticated", "invalid access token"))
		return
	}
	if r.URL.Path == "/files" {
		s.files(w, r, sb)
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Connect-Protocol-Version") != "1" {
		writeUnaryError(w, cerr("invalid_argument", "missing Connect-Protocol-Version"))
		return
	}
	switch r.URL.Path {
	case "/process.Process/Start":
		s.start(w, r, sb, gone)
	case "/process.Process/Connect":
		s.connectProc(w, r, sb, gone)
	case "/process.Process/StreamInput":
		s.streamInput(w, r, sb)
	case "/process.Process/SendInput", "/process.Process/CloseStdin", "/process.Process/SendSignal",
		"/process.Process/List", "/process.Process/Update":
		s.unary(w, r, sb)
	default:
		http.NotFound(w, r)
	}
}

func (s *Server) unary(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	if !hasType(r, "application/json") {
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	var req struct {
		Process *selector     `json:"process"`
		Input   *processInput `json:"input"`
		Signal  any           `json:"signal"`
		PTY     *struct {
			Size *ptySize `json:"size"`
		} `json:"pty"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 8<<20)).Decode(&req); err != nil {
		writeUnaryError(w, cerr("invalid_argument", "decode request: %v", err))
		return
	}
	var answer any = struct{}{}
	var e *connectErr
	if r.URL.Path == "/process.Process/List" {
		answer = s.listProcs(sb)
	} else {
		var p *proc
		if p, e = s.lookup(sb, req.Process); e == nil {
			switch r.URL.Path {
			case "/process.Process/SendInput":
				e = p.input(req.Input)
			case "/process.Process/CloseStdin":
				e = p.closeStdin()
			case "/process.Process/SendSignal":
				e = p.signal(req.Signal)
			case "/process.Process/Update":
				if req.PTY != nil && req.PTY.Size != nil && p.pty != nil {
					if err := setSize(p.pty, *req.PTY.Size); err != nil {
						e = cerr("internal", "error resizing tty: %v", err)
					}
				}
			}
		}
	}
	if e != nil {
		writeUnaryError(w, e)
		return
	}
	b, _ := json.Marshal(answer)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func (s *Server) lookup(sb *sandbox, sel *selector) (*proc, *connectErr) {
	if sel == nil || (sel.PID == nil) == (sel.Tag == nil) {
		return nil, cerr("invalid_argument", "invalid process selector")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sel.PID != nil {
		if p, ok := sb.procs[*sel.PID]; ok {
			return p, nil
		}
		return nil, cerr("not_found", "process with pid %d not found", *sel.PID)
	}
	for _, p := range sb.procs {
		if p.tag != "" && p.tag == *sel.Tag {
			return p, nil
		}
	}
	return nil, cerr("not_found", "process with tag %s not found", *sel.Tag)
}

func (s *Server) listProcs(sb *sandbox) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	type info struct {
		Config processConfig `json:"config"`
		PID    uint32        `json:"pid"`
		Tag    *string       `json:"tag,omitempty"`
	}
	out := []info{}
	for _, p := range sb.procs {
		i := info{Config: p.cfg, PID: p.pid}
		if p.tag != "" {
			t := p.tag
			i.Tag = &t
		}
		out = append(out, i)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return map[string]any{"processes": out}
}

// readStreamRequest reads the single enveloped request of a server stream.
func readStreamRequest(w http.ResponseWriter, r *http.Request, v any) bool {
	if !hasType(r, "application/connect+json") {
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return false
	}
	_, msg, err := readEnvelope(r.Body)
	if err == nil {
		err = json.Unmarshal(msg, v)
	}
	if err != nil {
		w.Header().Set("Content-Type", "application/connect+json")
		_, _ = w.Write(endStream(cerr("invalid_argument", "decode request: %v", err)))
		return false
	}
	return true
}

func (s *Server) start(w http.ResponseWriter, r *http.Request, sb *sandbox, gone chan struct{}) {
	var req struct {
		Process *processConfig `json:"process"`
		PTY     *struct {
			Size *ptySize `json:"size"`
		} `json:"pty"`
		Tag   *string `json:"tag"`
		Stdin *bool   `json:"stdin"`
	}
	if !readStreamRequest(w, r, &req) {
		return
	}
	w.Header().Set("Content-Type", "application/connect+json")
	if req.Process == nil || req.Process.Cmd == "" {
		_, _ = w.Write(endStream(cerr("invalid_argument", "process.cmd is required")))
		return
	}
	var lifetime time.Duration
	if v := r.Header.Get("Connect-Timeout-Ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || len(v) > 10 {
			_, _ = w.Write(endStream(cerr("invalid_argument", "bad Connect-Timeout-Ms")))
			return
		}
		lifetime = time.Duration(ms) * time.Millisecond
	}
	p := &proc{s: s, sb: sb, cfg: *req.Process, subs: map[*sub]struct{}{}, done: make(chan struct{}), chunk: s.opts.ChunkSize}
	if req.Tag != nil {
		p.tag = *req.Tag
	}
	var size *ptySize
	if req.PTY != nil {
		size = &ptySize{Cols: 80, Rows: 24}
		if req.PTY.Size != nil {
			size = req.PTY.Size
		}
	}
	// The answer's headers go out before the process exists, as a
	// streaming handler may send them: only the start event says the
	// process is registered.
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	// Subscribe before the process starts: its first bytes are not lost.
	me := p.subscribeLocked()
	if e := p.launch(sb, size, req.Stdin == nil || *req.Stdin, lifetime); e != nil {
		_, _ = w.Write(endStream(e))
		return
	}
	s.stream(w, r, p, me, gone)
}

func (s *Server) connectProc(w http.ResponseWriter, r *http.Request, sb *sandbox, gone chan struct{}) {
	var req struct {
		Process *selector `json:"process"`
	}
	if !readStreamRequest(w, r, &req) {
		return
	}
	w.Header().Set("Content-Type", "application/connect+json")
	p, e := s.lookup(sb, req.Process)
	if e != nil {
		_, _ = w.Write(endStream(e))
		return
	}
	me, ok := p.subscribe()
	if !ok {
		_, _ = w.Write(endStream(cerr("not_found", "process with pid %d not found", p.pid)))
		return
	}
	s.stream(w, r, p, me, gone)
}

// stream serves one subscriber: the start event, then data and end events
// as the process produces them, keepalives between.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, p *proc, me *sub, gone chan struct{}) {
	defer p.unsubscribe(me)
	flusher, _ := w.(http.Flusher)
	write := func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	start, _ := json.Marshal(map[string]any{"event": map[string]any{"start": map[string]any{"pid": p.pid}}})
	if !write(envelope(0, start)) {
		return
	}
	var tick <-chan time.Time
	interval := s.opts.KeepaliveInterval
	if interval <= 0 {
		if secs, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && secs > 0 {
			interval = time.Duration(secs) * time.Second
		}
	}
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	keepalive := envelope(0, []byte(`{"event":{"keepalive":{}}}`))
	deadlineErr := cerr("deadline_exceeded", "the operation timed out")
	for {
		select {
		case m := <-me.ch:
			if m.end && p.deadlineHit() {
				write(endStream(deadlineErr))
				return
			}
			if !write(envelope(0, m.body)) {
				return
			}
			if m.end {
				write(endStream(nil))
				return
			}
		case <-p.deadline:
			write(endStream(deadlineErr))
			return
		case <-tick:
			if !write(keepalive) {
				return
			}
		case <-r.Context().Done():
			// The client left. The process keeps running; its output is
			// dropped until someone subscribes again.
			return
		case <-gone:
			// Paused or killed: the proxy cuts the connection.
			panic(http.ErrAbortHandler)
		case <-s.closing:
			return
		}
	}
}

func (s *Server) streamInput(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	if !hasType(r, "application/connect+json") {
		w.WriteHeader(http.StatusUnsupportedMediaType)
		return
	}
	var p *proc
	var e *connectErr
	for e == nil {
		_, msg, err := readEnvelope(r.Body)
		if err == io.EOF {
			break
		}
		if err != nil {
			e = cerr("unknown", "error streaming input: %v", err)
			break
		}
		var ev struct {
			Start *struct {
				Process *selector `json:"process"`
			} `json:"start"`
			Data *struct {
				Input *processInput `json:"input"`
			} `json:"data"`
			Keepalive *struct{} `json:"keepalive"`
		}
		if err := json.Unmarshal(msg, &ev); err != nil {
			e = cerr("invalid_argument", "decode event: %v", err)
			break
		}
		switch {
		case ev.Start != nil:
			p, e = s.lookup(sb, ev.Start.Process)
		case ev.Data != nil && p != nil:
			e = p.input(ev.Data.Input)
		case ev.Data != nil:
			e = cerr("failed_precondition", "input before start")
		case ev.Keepalive != nil:
		default:
			e = cerr("unimplemented", "invalid event type")
		}
	}
	w.Header().Set("Content-Type", "application/connect+json")
	if e == nil {
		_, _ = w.Write(envelope(0, []byte("{}")))
	}
	_, _ = w.Write(endStream(e))
}

// proc is one real process in a sandbox.
type proc struct {
	s     *Server
	sb    *sandbox
	cmd   *exec.Cmd
	pid   uint32
	tag   string
	cfg   processConfig
	chunk int

	pty     *os.File   // the master, nil without a PTY
	readers []*os.File // stdout and stderr read ends, or the master

	inMu  sync.Mutex     // guards stdin (writes and close)
	stdin io.WriteCloser // nil when there is none or it was closed

	timer    *time.Timer   // the lifetime, nil without one
	deadline chan struct{} // closed when the lifetime elapsed; nil without one
	done     chan struct{} // closed after the end event went out

	mu     sync.Mutex // guards subs, ended and reaped
	subs   map[*sub]struct{}
	ended  bool
	reaped bool
}

type sub struct {
	ch   chan message
	gone chan struct{}
}

type message struct {
	body []byte
	end  bool
}

// subscribeLocked adds a subscriber; the caller holds p.mu or p is not
// shared yet.
func (p *proc) subscribeLocked() *sub {
	me := &sub{ch: make(chan message), gone: make(chan struct{})}
	p.subs[me] = struct{}{}
	return me
}

func (p *proc) subscribe() (*sub, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, false
	}
	return p.subscribeLocked(), true
}

func (p *proc) unsubscribe(me *sub) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.subs[me]; ok {
		delete(p.subs, me)
		close(me.gone)
	}
}

// broadcast hands m to every current subscriber, waiting for each (a slow
// subscriber slows the process, as on envd) unless it leaves. With nobody
// subscribed the output is dropped.
func (p *proc) broadcast(m message) {
	p.mu.Lock()
	subs := make([]*sub, 0, len(p.subs))
	for me := range p.subs {
		subs = append(subs, me)
	}
	p.mu.Unlock()
	for _, me := range subs {
		select {
		case me.ch <- m:
		case <-me.gone:
		}
	}
}

func (p *proc) deadlineHit() bool {
	select {
	case <-p.deadline:
		return true
	default:
		return false
	}
}

// launch starts the process and its reader and waiter goroutines.
func (p *proc) launch(sb *sandbox, size *ptySize, stdin bool, lifetime time.Duration) *connectErr {
	s := p.s
	cmd := exec.Command(p.cfg.Cmd, p.cfg.Args...)
	cmd.Dir = sb.dir
	if p.cfg.Cwd != nil && *p.cfg.Cwd != "" {
		cmd.Dir = *p.cfg.Cwd
	}
	cmd.Env = append(os.Environ(), TagEnv+"="+sb.id)
	for k, v := range sb.envVars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range p.cfg.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	if size != nil {
		master, slave, err := openPTY(*size)
		if err != nil {
			return cerr("internal", "error starting pty: %v", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		p.pty = master
		p.readers = []*os.File{master}
		childEnds = []*os.File{slave}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		for range 2 {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(p.readers)
				closeAll(childEnds)
				return cerr("internal", "error creating pipe: %v", err)
			}
			p.readers = append(p.readers, r)
			childEnds = append(childEnds, w)
		}
		cmd.Stdout, cmd.Stderr = childEnds[0], childEnds[1]
		if stdin {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(p.readers)
				closeAll(childEnds)
				return cerr("internal", "error creating pipe: %v", err)
			}
			cmd.Stdin = r
			childEnds = append(childEnds, r)
			p.stdin = w
		}
	}
	if err := cmd.Start(); err != nil {
		closeAll(p.readers)
		closeAll(childEnds)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return cerr("internal", "error starting process: %v", err)
	}
	closeAll(childEnds)
	p.cmd = cmd
	p.pid = uint32(cmd.Process.Pid)
	if d := s.opts.RegisterDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
		}
	}

	s.mu.Lock()
	alive := sb.procs != nil && s.sandboxes[sb.id] == sb
	if alive {
		sb.procs[p.pid] = p
	}
	s.mu.Unlock()
	if !alive {
		p.kill()
	}
	if lifetime > 0 {
		p.deadline = make(chan struct{})
		p.timer = time.AfterFunc(lifetime, func() {
			close(p.deadline)
			p.kill()
		})
	}
	var readers sync.WaitGroup
	for i, f := range p.readers {
		field := [...]string{"stdout", "stderr"}[i]
		if p.pty != nil {
			field = "pty"
		}
		readers.Add(1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer readers.Done()
			p.read(f, field)
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		readers.Wait()
		p.wait()
	}()
	return nil
}

// read forwards output in chunks of at most p.chunk bytes.
func (p *proc) read(f *os.File, field string) {
	if f != p.pty {
		defer f.Close()
	}
	// The PTY master stays open until the process is reaped (wait closes
	// it): closing it earlier hangs the terminal up under a process that
	// is still running.
	buf := make([]byte, p.chunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			b, _ := json.Marshal(map[string]any{"event": map[string]any{"data": map[string][]byte{field: buf[:n]}}})
			p.broadcast(message{body: b})
		}
		if err != nil {
			// EOF for a pipe; EIO for a PTY master once the terminal's
			// last holder closed it.
			return
		}
	}
}

// wait reaps the process and sends the end event, as envd reports it from
// os.ProcessState (protojson leaves out zero fields).
func (p *proc) wait() {
	// Wait for the exit without reaping, mark the process reaped, then
	// reap: group signals (kill, pause) check the mark under p.mu, so none
	// is ever sent to a process group whose id the kernel may reuse.
	waitNoReap(p.pid)
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()
	err := p.cmd.Wait()
	if p.timer != nil {
		p.timer.Stop()
	}
	p.inMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	if p.pty != nil {
		p.pty.Close()
	}
	end := map[string]any{}
	st := p.cmd.ProcessState
	if code := st.ExitCode(); code != 0 {
		end["exitCode"] = code
	}
	if st.Exited() {
		end["exited"] = true
	}
	end["status"] = st.String()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		end["error"] = err.Error()
	}
	b, _ := json.Marshal(map[string]any{"event": map[string]any{"end": end}})
	p.s.mu.Lock()
	if p.sb.procs[p.pid] == p {
		delete(p.sb.procs, p.pid)
	}
	p.s.mu.Unlock()
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
	p.broadcast(message{body: b, end: true})
	close(p.done)
}

func (p *proc) input(in *processInput) *connectErr {
	if in == nil {
		return cerr("unimplemented", "invalid input type")
	}
	if in.PTY != nil {
		if p.pty == nil {
			return cerr("internal", "error writing to tty: tty not assigned to process")
		}
		if _, err := p.pty.Write(in.PTY); err != nil {
			return cerr("internal", "error writing to tty: %v", err)
		}
		return nil
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return cerr("internal", "error writing to stdin: stdin not enabled or closed")
	}
	if _, err := p.stdin.Write(in.Stdin); err != nil {
		return cerr("internal", "error writing to stdin: %v", err)
	}
	return nil
}

func (p *proc) closeStdin() *connectErr {
	if p.pty != nil {
		return cerr("unknown", "error closing stdin: cannot close stdin for PTY process, send Ctrl+D (0x04) instead")
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return cerr("unknown", "error closing stdin: stdin not enabled or already closed")
	}
	err := p.stdin.Close()
	p.stdin = nil
	if err != nil {
		return cerr("unknown", "error closing stdin: %v", err)
	}
	return nil
}

func (p *proc) signal(v any) *connectErr {
	var sig syscall.Signal
	switch v {
	case "SIGNAL_SIGKILL", float64(9):
		sig = syscall.SIGKILL
	case "SIGNAL_SIGTERM", float64(15):
		sig = syscall.SIGTERM
	default:
		return cerr("invalid_argument", "invalid signal: %v", v)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return cerr("internal", "error sending signal: %v", err)
	}
	return nil
}

// kill ends the process's whole group (its own session for a PTY).
func (p *proc) kill() { p.signalGroup(syscall.SIGKILL) }

// abort kills the group and closes the output read ends, so the readers
// finish even when a descendant outside the group still holds the pipes.
func (p *proc) abort() {
	p.kill()
	for _, f := range p.readers {
		f.Close()
	}
}

// signalGroup signals the process's group while its leader is not yet
// reaped (its id cannot have been reused).
func (p *proc) signalGroup(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil && !p.reaped {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// waitNoReap blocks until pid exits, leaving it a zombie (waitid with
// WNOWAIT; the syscall package has no wrapper).
func waitNoReap(pid uint32) {
	const pPID, wExited, wNoWait = 1, 0x4, 0x1000000
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}
