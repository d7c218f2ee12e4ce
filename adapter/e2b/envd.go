package e2b

// The envd process client: the Envd type, its request and event messages,
// the unary calls and Start/Connect, which open a Stream (envdstream.go).

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
)

// KeepalivePingInterval is what the SDKs ask envd for in the
// Keepalive-Ping-Interval header (seconds between keepalive events on a
// stream), so that idle streams survive proxies.
const KeepalivePingInterval = 50

// Envd is the client of one sandbox's envd process service
// (process.Process). It is safe for concurrent use and holds no goroutines;
// streams it opens are closed by their own Close.
type Envd struct {
	base      string
	sandboxID string
	token     Secret
	user      string
	hc        *http.Client
	call      httpcall.Caller // unary calls, streams and files
}

// String names the sandbox without its token.
func (e *Envd) String() string { return "e2b.Envd{" + e.sandboxID + "}" }

// GoString is String: %#v must not dump the token.
func (e *Envd) GoString() string { return e.String() }

// ProcessConfig is the process to run (message ProcessConfig). Cmd is run
// directly with Args, no shell.
type ProcessConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

// PTYSize is a terminal size.
type PTYSize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

// StartRequest starts a process.
type StartRequest struct {
	Process ProcessConfig
	// PTY, when set, runs the process on a terminal of this size; its
	// output then arrives as Event.PTY and stdin cannot be closed (send
	// ^D, 0x04, instead).
	PTY *PTYSize
	// Tag names the process for a Selector.
	Tag string
	// Stdin opens the process's stdin pipe; nil leaves envd's default
	// (open). With false, stdin is /dev/null.
	Stdin *bool
	// Lifetime, when positive, is sent as Connect-Timeout-Ms: envd kills
	// the process when it elapses, whether or not anyone listens. Zero
	// means no bound. The context's deadline is deliberately NOT sent: it
	// would become the process's lifetime.
	Lifetime time.Duration
}

// Selector names a process by pid or by tag (exactly one).
type Selector struct {
	PID uint32
	Tag string
}

func (s Selector) wire() (map[string]any, error) {
	switch {
	case s.PID != 0 && s.Tag == "":
		return map[string]any{"pid": s.PID}, nil
	case s.PID == 0 && s.Tag != "":
		return map[string]any{"tag": s.Tag}, nil
	}
	return nil, invalid("a process selector names a pid or a tag, exactly one")
}

// Signal is envd's Signal enum.
type Signal int32

// The signals envd delivers.
const (
	SIGTERM Signal = 15
	SIGKILL Signal = 9
)

func (s Signal) wire() (string, error) {
	switch s {
	case SIGTERM:
		return "SIGNAL_SIGTERM", nil
	case SIGKILL:
		return "SIGNAL_SIGKILL", nil
	}
	return "", invalid("envd delivers only SIGTERM and SIGKILL")
}

// EndEvent is the process's end (message ProcessEvent.EndEvent), as envd
// reports it from Go's os.ProcessState: ExitCode is -1 for a process a
// signal ended, Exited is false then, and Status reads "signal: killed".
type EndEvent struct {
	ExitCode int32
	Exited   bool
	Status   string
	Error    string
}

// Event is one event of a process stream. Exactly one of Stdout, Stderr,
// PTY (non-empty) or End (non-nil) is set. Keepalives are not events.
type Event struct {
	Stdout, Stderr, PTY []byte
	End                 *EndEvent
}

// ProcessInfo is one entry of List.
type ProcessInfo struct {
	Config ProcessConfig
	PID    uint32
	Tag    string
}

// wireEvent decodes ProcessEvent in protojson form. protojson emits
// lowerCamelCase names and parsers accept the proto names too, so both
// spellings of exit_code are read.
type wireEvent struct {
	Event *struct {
		Start *struct {
			PID uint32 `json:"pid"`
		} `json:"start"`
		Data *struct {
			Stdout []byte `json:"stdout"`
			Stderr []byte `json:"stderr"`
			PTY    []byte `json:"pty"`
		} `json:"data"`
		End *struct {
			ExitCode      *int32  `json:"exitCode"`
			ExitCodeProto *int32  `json:"exit_code"`
			Exited        bool    `json:"exited"`
			Status        string  `json:"status"`
			Error         *string `json:"error"`
		} `json:"end"`
		Keepalive *struct{} `json:"keepalive"`
	} `json:"event"`
}

func (e *Envd) headers(h http.Header) {
	h.Set("Connect-Protocol-Version", "1")
	e.routeHeaders(h)
}

// routeHeaders are every envd request's headers, the files API's
// included: the sandbox's route and the credentials.
func (e *Envd) routeHeaders(h http.Header) {
	h.Set("E2b-Sandbox-Id", e.sandboxID)
	h.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	if !e.token.IsZero() {
		h.Set("X-Access-Token", e.token.Reveal())
	}
	if e.user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(e.user+":")))
	}
}

func (e *Envd) red() httpcall.Redactor { return httpcall.Redact(e.token) }

// unary calls one unary procedure of process.Process with the JSON codec.
func (e *Envd) unary(ctx context.Context, op, method string, in, out any) error {
	op = "envd " + op
	b, err := json.Marshal(in)
	if err != nil {
		return fail(op, 0, invalid("encode request: "+err.Error()))
	}
	h := http.Header{"Connect-Protocol-Version": {"1"}}
	if dl, ok := ctx.Deadline(); ok {
		// A unary call's deadline only bounds the call itself.
		if ms := time.Until(dl).Milliseconds(); ms > 0 {
			h.Set("Connect-Timeout-Ms", strconv.FormatInt(ms, 10))
		}
	}
	rep, err := e.call.Do(ctx, &httpcall.Request{Op: op, Method: http.MethodPost, URL: "/process.Process/" + method,
		Body: bytes.NewReader(b), ContentType: contentTypeUnary, Header: h, OK: []int{http.StatusOK}})
	if err != nil {
		return err
	}
	if !isContentType(rep.Header, contentTypeUnary) {
		return fail(op, rep.Status, unavailable("answer is not "+contentTypeUnary))
	}
	if out == nil {
		out = &struct{}{}
	}
	if err := json.Unmarshal(rep.Body, out); err != nil {
		return fail(op, rep.Status, unavailable("decode answer: "+err.Error()))
	}
	return nil
}

// httpError maps a non-200 answer: a Connect error body means envd spoke;
// anything else is a proxy's answer.
func httpError(op string, status int, h http.Header, raw []byte, red httpcall.Redactor) error {
	var we wireError
	if isContentType(h, contentTypeUnary) && json.Unmarshal(raw, &we) == nil && we.Code != "" {
		return connectError(op, status, h, we.Code, we.Message, true, red)
	}
	return connectError(op, status, h, connectStatusCode(status), "", false, red)
}

func isContentType(h http.Header, want string) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == want
}

// Start starts a process and returns its stream once envd has acknowledged
// it with the start event: the process exists and its pid is known, so a
// caller may write stdin at once (returning earlier lost a race in the
// seeds' E2B adapter). ctx bounds the stream, not the process: envd keeps
// the process running when the stream ends (see StartRequest.Lifetime).
func (e *Envd) Start(ctx context.Context, req StartRequest) (*Stream, error) {
	msg := map[string]any{"process": req.Process}
	if req.PTY != nil {
		msg["pty"] = map[string]any{"size": req.PTY}
	}
	if req.Tag != "" {
		msg["tag"] = req.Tag
	}
	if req.Stdin != nil {
		msg["stdin"] = *req.Stdin
	}
	var lifetime string
	if req.Lifetime > 0 {
		lifetime = strconv.FormatInt(max(req.Lifetime.Milliseconds(), 1), 10)
	}
	return e.openStream(ctx, "start "+req.Process.Cmd, "Start", msg, lifetime)
}

// Connect attaches to a running process (rpc Connect): the stream starts
// with the process's start event and carries only output produced from now
// on (envd keeps no backlog).
func (e *Envd) Connect(ctx context.Context, sel Selector) (*Stream, error) {
	ws, err := sel.wire()
	if err != nil {
		return nil, fail("envd connect", 0, err)
	}
	return e.openStream(ctx, "connect", "Connect", map[string]any{"process": ws}, "")
}

func (e *Envd) openStream(ctx context.Context, op, method string, in any, timeoutMs string) (*Stream, error) {
	op = "envd " + op
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fail(op, 0, invalid("encode request: "+err.Error()))
	}
	h := http.Header{"Connect-Protocol-Version": {"1"}, "Keepalive-Ping-Interval": {strconv.Itoa(KeepalivePingInterval)}}
	if timeoutMs != "" {
		h.Set("Connect-Timeout-Ms", timeoutMs)
	}
	sctx, cancel := context.WithCancel(ctx)
	resp, _, err := e.call.Open(sctx, &httpcall.Request{Op: op, Method: http.MethodPost, URL: "/process.Process/" + method,
		Body: bytes.NewReader(appendEnvelope(nil, 0, b)), ContentType: contentTypeStream, Header: h, OK: []int{http.StatusOK}})
	if err != nil {
		cancel()
		return nil, err
	}
	if !isContentType(resp.Header, contentTypeStream) {
		resp.Body.Close()
		cancel()
		return nil, fail(op, resp.StatusCode, unavailable("answer is not "+contentTypeStream))
	}
	s := &Stream{ctx: ctx, cancel: cancel, body: resp.Body, op: op, red: e.red()}
	// Block on envd's acknowledgement: the first event must be start{pid}.
	for {
		ev, start, err := s.next()
		if err != nil {
			s.Close()
			if err == io.EOF {
				return nil, fail(op, 0, unavailable("stream ended before the start event"))
			}
			return nil, err
		}
		if start != 0 {
			s.pid = start
			return s, nil
		}
		if ev != nil {
			s.Close()
			return nil, fail(op, 0, unavailable("output before the start event"))
		}
	}
}

func providerErr(detail string) error {
	return &adapter.ProviderError{Provider: provider, Detail: detail}
}

// SendInput writes data to the process's stdin, or to its terminal when
// pty is set (rpc SendInput). Order between calls is the caller's: use
// StreamInput when writes must not reorder.
func (e *Envd) SendInput(ctx context.Context, sel Selector, data []byte, pty bool) error {
	ws, err := sel.wire()
	if err != nil {
		return fail("envd send input", 0, err)
	}
	return e.unary(ctx, "send input", "SendInput", map[string]any{"process": ws, "input": inputMsg(data, pty)}, nil)
}

func inputMsg(data []byte, pty bool) map[string]any {
	if data == nil {
		data = []byte{}
	}
	if pty {
		return map[string]any{"pty": data}
	}
	return map[string]any{"stdin": data}
}

// CloseStdin closes the process's stdin (rpc CloseStdin): the process reads
// EOF. envd refuses it for a PTY process.
func (e *Envd) CloseStdin(ctx context.Context, sel Selector) error {
	ws, err := sel.wire()
	if err != nil {
		return fail("envd close stdin", 0, err)
	}
	return e.unary(ctx, "close stdin", "CloseStdin", map[string]any{"process": ws}, nil)
}

// SendSignal delivers SIGTERM or SIGKILL to the process (rpc SendSignal).
func (e *Envd) SendSignal(ctx context.Context, sel Selector, sig Signal) error {
	ws, err := sel.wire()
	if err != nil {
		return fail("envd send signal", 0, err)
	}
	name, err := sig.wire()
	if err != nil {
		return fail("envd send signal", 0, err)
	}
	return e.unary(ctx, "send signal", "SendSignal", map[string]any{"process": ws, "signal": name}, nil)
}

// Resize changes a PTY process's terminal size (rpc Update).
func (e *Envd) Resize(ctx context.Context, sel Selector, size PTYSize) error {
	ws, err := sel.wire()
	if err != nil {
		return fail("envd resize", 0, err)
	}
	return e.unary(ctx, "resize", "Update", map[string]any{"process": ws, "pty": map[string]any{"size": size}}, nil)
}

// List returns the processes envd runs (rpc List).
func (e *Envd) List(ctx context.Context) ([]ProcessInfo, error) {
	var out struct {
		Processes []struct {
			Config ProcessConfig `json:"config"`
			PID    uint32        `json:"pid"`
			Tag    *string       `json:"tag"`
		} `json:"processes"`
	}
	if err := e.unary(ctx, "list processes", "List", struct{}{}, &out); err != nil {
		return nil, err
	}
	ps := make([]ProcessInfo, 0, len(out.Processes))
	for _, p := range out.Processes {
		pi := ProcessInfo{Config: p.Config, PID: p.PID}
		if p.Tag != nil {
			pi.Tag = *p.Tag
		}
		ps = append(ps, pi)
	}
	return ps, nil
}
