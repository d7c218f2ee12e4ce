package e2btest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/agentrunner/runner/adapter/internal/standin"
)

const (
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

// envdJSONError is envd's jsonError: its HTTP layer's {code, message}
// answer, outside the Connect protocol.
func envdJSONError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(map[string]any{"code": status, "message": msg})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeUnaryOrStreamError answers a Connect error the way the call's
// protocol carries it: a unary error body, or an end-stream message.
func writeUnaryOrStreamError(w http.ResponseWriter, r *http.Request, e *connectErr) {
	if hasType(r, "application/connect+json") {
		w.Header().Set("Content-Type", "application/connect+json")
		_, _ = w.Write(endStream(e))
		return
	}
	writeUnaryError(w, e)
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
	// envd of a secure sandbox refuses a request without its token with
	// a plain JSON 401 (its HTTP middleware, not a Connect error); /files
	// is checked the same way when the token is sent.
	if token != "" && r.Header.Get("X-Access-Token") != token && (r.URL.Path != "/files" || r.Header.Get("X-Access-Token") != "") {
		envdJSONError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
		return
	}
	u, ok := authUser(r)
	if !ok {
		name, _, _ := r.BasicAuth()
		if r.URL.Path == "/files" {
			envdJSONError(w, http.StatusUnauthorized, fmt.Sprintf("invalid username: '%s'", name))
		} else {
			writeUnaryOrStreamError(w, r, cerr("unauthenticated", "invalid username: '%s'", name))
		}
		return
	}
	if r.URL.Path == "/files" {
		s.files(w, r, sb, u)
		return
	}
	if r.Method != http.MethodPost || r.Header.Get("Connect-Protocol-Version") != "1" {
		writeUnaryError(w, cerr("invalid_argument", "missing Connect-Protocol-Version"))
		return
	}
	switch r.URL.Path {
	case "/process.Process/Start":
		s.start(w, r, sb, gone, u)
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
					if err := standin.SetPTYSize(p.pty, uint16(req.PTY.Size.Rows), uint16(req.PTY.Size.Cols)); err != nil {
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

func (s *Server) start(w http.ResponseWriter, r *http.Request, sb *sandbox, gone chan struct{}, u user) {
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
	if !s.keepaliveOK(w, r) {
		return
	}
	p := &proc{s: s, sb: sb, cfg: *req.Process, user: u, subs: map[*sub]struct{}{}, done: make(chan struct{}), chunk: s.opts.ChunkSize}
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
	if !s.keepaliveOK(w, r) {
		return
	}
	p, e := s.lookup(sb, req.Process)
	var me *sub
	if e == nil {
		var live bool
		if me, live = p.subscribe(); !live {
			e = cerr("not_found", "process with pid %d not found", p.pid)
		}
	}
	if e != nil {
		// envd keeps an ended process's end event for 30 s and serves a
		// Connect to it as its start and end events.
		if pid, end, ok := s.terminated(sb, req.Process); ok {
			start, _ := json.Marshal(map[string]any{"event": map[string]any{"start": map[string]any{"pid": pid}}})
			_, _ = w.Write(append(append(envelope(0, start), envelope(0, end)...), endStream(nil)...))
			return
		}
		_, _ = w.Write(endStream(e))
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
	// envd's keepalive: every Keepalive-Ping-Interval seconds (90 without
	// a number), the ticker restarted after each data event.
	interval := s.opts.KeepaliveInterval
	if interval <= 0 {
		interval = 90 * time.Second
		if secs, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil {
			interval = time.Duration(secs) * time.Second
		}
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	tick := ticker.C
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
			ticker.Reset(interval)
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

// keepaliveOK refuses a stream whose Keepalive-Ping-Interval is a number
// below 1: real envd passes it to time.NewTicker, which panics, and the
// whole daemon goes down. The stand-in fails the test and cuts the
// connection, so a client that would crash envd cannot pass CI.
func (s *Server) keepaliveOK(w http.ResponseWriter, r *http.Request) bool {
	secs, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval"))
	if err != nil || secs > 0 {
		return true
	}
	s.t.Errorf("e2btest: a stream asked for Keepalive-Ping-Interval: %d, which crashes real envd (time.NewTicker panics)", secs)
	panic(http.ErrAbortHandler)
}
