package sprites

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
	"github.com/coder/websocket"
)

// The stream ids of the exec protocol's binary frames (non-TTY mode): the
// first byte of every binary message names its stream, the rest is payload.
// In TTY mode binary messages are raw terminal bytes with no prefix.
const (
	StreamStdin    byte = 0 // client → server: stdin bytes
	StreamStdout   byte = 1 // server → client: stdout bytes
	StreamStderr   byte = 2 // server → client: stderr bytes
	StreamExit     byte = 3 // server → client: the exit code, ONE byte
	StreamStdinEOF byte = 4 // client → server: end of stdin
	StreamSSHAgent byte = 5 // both ways: SSH agent forwarding (ignored here)
)

// DefaultRunAfterDisconnect is how long Sprites lets a non-TTY command run
// after its WebSocket disconnects when ExecOptions.MaxRunAfterDisconnect is
// zero. TTY commands run on forever by default.
const DefaultRunAfterDisconnect = 10 * time.Second

// RunForever, as ExecOptions.MaxRunAfterDisconnect, keeps the command
// running after a disconnect until it exits (the API's value 0).
const RunForever time.Duration = -1

// maxChunk bounds the payload of one stdin frame.
const maxChunk = 32 << 10

// maxMessage bounds one incoming WebSocket message.
const maxMessage = 16 << 20

// ExecOptions is one command to run in a sprite (the query of
// WSS /v1/sprites/{name}/exec).
type ExecOptions struct {
	// Argv is the command and its arguments (repeated "cmd"); required.
	Argv []string
	// Path, when set, is the executable to run instead of Argv[0].
	Path string
	// Env, when set, replaces the sprite's default environment
	// ("KEY=VALUE"). It travels in the URL query: never put a secret here,
	// pass it on stdin or in a file.
	Env []string
	// Dir is the working directory; empty means the sprite's default.
	Dir string
	// TTY runs the command on a terminal: output arrives raw (stdout and
	// stderr merged), the exit arrives as the JSON exit message, and there
	// is no stdin EOF frame.
	TTY bool
	// Rows and Cols are the initial terminal size (TTY only).
	Rows, Cols uint16
	// Stdin announces that the client will send stdin. Without it the
	// server gives the command no input.
	Stdin bool
	// MaxRunAfterDisconnect is how long the command may run once the
	// WebSocket is gone: 0 means the API's default (DefaultRunAfterDisconnect
	// for non-TTY, forever for TTY), RunForever means until it exits, a
	// positive value is sent as whole milliseconds or seconds.
	MaxRunAfterDisconnect time.Duration
}

func (o ExecOptions) query() (url.Values, error) {
	if len(o.Argv) == 0 || o.Argv[0] == "" {
		return nil, invalid("empty argv")
	}
	if !o.TTY && (o.Rows != 0 || o.Cols != 0) {
		return nil, invalid("rows and cols need a TTY")
	}
	if o.MaxRunAfterDisconnect < 0 && o.MaxRunAfterDisconnect != RunForever {
		return nil, invalid("negative max_run_after_disconnect")
	}
	q := url.Values{}
	for _, a := range o.Argv {
		q.Add("cmd", a)
	}
	path := o.Path
	if path == "" {
		path = o.Argv[0]
	}
	q.Set("path", path)
	for _, e := range o.Env {
		if !strings.Contains(e, "=") {
			return nil, invalid("env entry without '='")
		}
		q.Add("env", e)
	}
	if o.Dir != "" {
		q.Set("dir", o.Dir)
	}
	if o.TTY {
		q.Set("tty", "true")
		if o.Rows != 0 || o.Cols != 0 {
			q.Set("rows", strconv.Itoa(int(o.Rows)))
			q.Set("cols", strconv.Itoa(int(o.Cols)))
		}
	}
	q.Set("stdin", strconv.FormatBool(o.Stdin))
	if v := formatRunAfter(o.MaxRunAfterDisconnect); v != "" {
		q.Set("max_run_after_disconnect", v)
	}
	return q, nil
}

// formatRunAfter spells a duration the way the API's examples do ("0",
// "200ms", "600s"); "" means not sent.
func formatRunAfter(d time.Duration) string {
	switch {
	case d == 0:
		return ""
	case d == RunForever:
		return "0"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	default:
		ms := (d + time.Millisecond - 1) / time.Millisecond
		return strconv.FormatInt(int64(ms), 10) + "ms"
	}
}

// SessionInfo is the session_info message the server sends first on every
// exec and attach.
type SessionInfo struct {
	// SessionID names the session for attach and kill (Sprites uses the
	// process id, as a decimal string).
	SessionID string
	Command   string
	Created   time.Time
	Rows      uint16
	Cols      uint16
	IsOwner   bool
	TTY       bool
}

// EventKind says what an [Event] carries.
type EventKind int

// The kinds of events Recv returns.
const (
	// EventStdout carries stdout bytes (in TTY mode: the terminal's output).
	EventStdout EventKind = iota + 1
	// EventStderr carries stderr bytes (never in TTY mode).
	EventStderr
	// EventExit carries the command's exit code; it is the last event.
	EventExit
	// EventInfo carries the session_info message.
	EventInfo
	// EventText carries any other JSON message (port notifications, and
	// the JSON exit message of a non-TTY session, which is not the end:
	// output still follows it) as is.
	EventText
	// EventNoExit is an exit frame without its code byte: the command
	// ended with an unknown status. Recv turns it into an error wrapping
	// [ErrNoExit]; ParseFrame returns it as is.
	EventNoExit
)

// Event is one thing the exec WebSocket delivered.
type Event struct {
	Kind EventKind
	// Data is the payload of EventStdout, EventStderr and EventText.
	Data []byte
	// ExitCode is EventExit's code, 0..255 (a signal death is 128+n).
	ExitCode int
	// Info is EventInfo's message.
	Info SessionInfo
}

// ParseFrame decodes one binary message of a non-TTY session. The exit
// frame's payload is ONE byte: the code is payload[0], 0..255 (a client
// that read four bytes once reported a 0 nobody sent). An exit frame
// without a payload is [EventNoExit]: the command ended and its code is
// unknown — never exit 0, and not a protocol error either (sprites-go's
// ExitCode gives -1 for "no code received"; the caller's own record, such
// as runner-shim's answer, decides). ok is false for a stream this client
// does not handle (SSH agent, stdin echoes, empty messages), which the
// caller skips.
func ParseFrame(msg []byte) (ev Event, ok bool, err error) {
	if len(msg) == 0 {
		return Event{}, false, nil
	}
	payload := msg[1:]
	switch msg[0] {
	case StreamStdout:
		return Event{Kind: EventStdout, Data: payload}, true, nil
	case StreamStderr:
		return Event{Kind: EventStderr, Data: payload}, true, nil
	case StreamExit:
		if len(payload) == 0 {
			return Event{Kind: EventNoExit}, true, nil
		}
		return Event{Kind: EventExit, ExitCode: int(payload[0])}, true, nil
	}
	return Event{}, false, nil
}

// controlMessage is a JSON text message either way.
type controlMessage struct {
	Type   string `json:"type"`
	Cols   uint16 `json:"cols,omitempty"`
	Rows   uint16 `json:"rows,omitempty"`
	Signal string `json:"signal,omitempty"`
}

// Session is one exec WebSocket. Recv must be called from one goroutine at
// a time; WriteStdin, CloseStdin, Resize and Signal may be called
// concurrently with it and with each other. The owner must Close it;
// closing disconnects, and the command then runs on for
// MaxRunAfterDisconnect.
//
// A context that ends during any call closes the WebSocket (coder/websocket
// cannot abandon a frame half-read or half-written).
type Session struct {
	conn  *websocket.Conn
	op    string
	tty   bool
	stdin bool
	caps  map[string]bool
	red   httpcall.Redactor

	stopPing context.CancelFunc // ends the pinger
	pinger   sync.WaitGroup     // the pinger goroutine, owned by the Session

	mu         sync.Mutex // guards the fields below
	info       SessionInfo
	haveInfo   bool
	exited     bool
	exitCode   int
	stdinShut  bool
	closed     bool
	closeError error
}

// Exec starts a command in sprite name and returns once the WebSocket is
// up (the server answered 101): stdin written right away is delivered.
// An upgrade refused by the API maps like any other answer (never
// not_found: a vanished sprite is confirmed with Get).
func (c *Client) Exec(ctx context.Context, name string, opts ExecOptions) (*Session, error) {
	op := "exec in sprite " + name
	q, err := opts.query()
	if err != nil {
		return nil, fail(op, 0, err)
	}
	rawQuery := q.Encode()
	pathQuery := spritePath(name) + "/exec?" + rawQuery
	u := c.base + pathQuery
	// The query carries the argv and the environment: neither may reach an
	// error, even when a server echoes the request back.
	red := httpcall.Redactor{Secrets: []Secret{c.token}, Plain: []string{u, strings.Replace(u, "http", "ws", 1), pathQuery, rawQuery}}
	for _, kv := range opts.Env {
		red.Plain = append(red.Plain, kv)
		if _, v, _ := strings.Cut(kv, "="); len(v) >= 4 {
			red.Plain = append(red.Plain, v)
		}
	}
	// coder/websocket takes http(s) URLs and upgrades them itself.
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.token.Reveal())
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var raw []byte
			if resp.Body != nil {
				raw, _ = io.ReadAll(resp.Body)
			}
			eb, hasBody := parseErrorBody(raw)
			return nil, apiStatusError(op, opOther, resp.StatusCode, resp.Header, eb, hasBody, red)
		}
		return nil, httpcall.TransportError(ctx, provider, op, err, true, red)
	}
	conn.SetReadLimit(maxMessage)
	s := &Session{conn: conn, op: op, tty: opts.TTY, stdin: opts.Stdin, caps: map[string]bool{}, red: red}
	for _, cp := range strings.Split(resp.Header.Get("X-Sprite-Capabilities"), ",") {
		if cp = strings.TrimSpace(cp); cp != "" {
			s.caps[cp] = true
		}
	}
	pctx, stop := context.WithCancel(context.Background())
	s.stopPing = stop
	if c.ping > 0 {
		s.pinger.Add(1)
		go s.keepalive(pctx, c.ping)
	}
	return s, nil
}

// keepalive pings every interval until Close, as sprites-go does
// (websocket.go: wsPingInterval = 15 s), so the proxies on the way never
// take a quiet exec (an attach waiting for output) for a dead one. A ping
// answered late or not at all is not an error of the session: its reads
// say whether the connection is alive.
func (s *Session) keepalive(ctx context.Context, every time.Duration) {
	defer s.pinger.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		// coder/websocket's Ping needs a concurrent Read for its pong: a
		// Session that nobody reads just sees the timeout here.
		_ = s.conn.Ping(pctx)
		cancel()
	}
}

// HasCapability reports whether the server advertised cap ("signal") in
// the X-Sprite-Capabilities header of the upgrade.
func (s *Session) HasCapability(cap string) bool { return s.caps[cap] }

// Info returns the session_info message, once Recv has seen it.
func (s *Session) Info() (SessionInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info, s.haveInfo
}

// Recv returns the next event. After EventExit it returns io.EOF. A
// WebSocket that closes before the exit — with status 1000 or otherwise —
// gives an error wrapping [ErrNoExit] (kind unavailable, Uncertain): the
// command's exit is unknown and is never reported as 0.
func (s *Session) Recv(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		done, closed := s.exited, s.closed
		s.mu.Unlock()
		if done {
			return Event{}, io.EOF
		}
		if closed {
			return Event{}, fail(s.op, 0, invalid("session closed"))
		}
		typ, msg, err := s.conn.Read(ctx)
		if err != nil {
			return Event{}, s.readError(ctx, err)
		}
		ev, ok, err := s.decode(typ, msg)
		if err != nil {
			return Event{}, fail(s.op, 0, err)
		}
		if !ok {
			continue
		}
		switch ev.Kind {
		case EventNoExit:
			return Event{}, fail(s.op, 0, &adapter.UnavailableError{Detail: "the exit frame carried no code", Uncertain: true}).WithCause(ErrNoExit)
		case EventExit:
			s.mu.Lock()
			s.exited, s.exitCode = true, ev.ExitCode
			s.mu.Unlock()
		case EventInfo:
			s.mu.Lock()
			s.info, s.haveInfo = ev.Info, true
			s.mu.Unlock()
		}
		return ev, nil
	}
}

func (s *Session) decode(typ websocket.MessageType, msg []byte) (Event, bool, error) {
	if typ == websocket.MessageText {
		var m struct {
			Type      string          `json:"type"`
			ExitCode  *int            `json:"exit_code"`
			SessionID json.RawMessage `json:"session_id"`
			Command   string          `json:"command"`
			Created   int64           `json:"created"`
			Cols      uint16          `json:"cols"`
			Rows      uint16          `json:"rows"`
			IsOwner   bool            `json:"is_owner"`
			TTY       bool            `json:"tty"`
		}
		if err := json.Unmarshal(msg, &m); err != nil {
			return Event{Kind: EventText, Data: msg}, true, nil
		}
		switch m.Type {
		case "exit":
			if !s.tty {
				// The asyncapi's ExitMessage, seen by a field capture before
				// the binary exit frame of a non-TTY exec: output may still
				// follow it (runner-shim's answer did), so it ends nothing.
				// The binary frame (stream 3) is the non-TTY exit.
				return Event{Kind: EventText, Data: msg}, true, nil
			}
			if m.ExitCode == nil || *m.ExitCode < 0 || *m.ExitCode > 255 {
				return Event{}, false, &adapter.ProviderError{Provider: provider, Detail: "exit message without a valid exit_code"}
			}
			return Event{Kind: EventExit, ExitCode: *m.ExitCode}, true, nil
		case "session_info":
			// session_id is a string in the API reference and a number in
			// older servers (sprites-go reads an int): accept both.
			id := strings.Trim(string(m.SessionID), `"`)
			return Event{Kind: EventInfo, Info: SessionInfo{
				SessionID: id, Command: m.Command, Created: time.Unix(m.Created, 0).UTC(),
				Rows: m.Rows, Cols: m.Cols, IsOwner: m.IsOwner, TTY: m.TTY,
			}}, true, nil
		}
		return Event{Kind: EventText, Data: msg}, true, nil
	}
	if s.tty {
		if len(msg) == 0 {
			return Event{}, false, nil
		}
		return Event{Kind: EventStdout, Data: msg}, true, nil
	}
	return ParseFrame(msg)
}

func (s *Session) readError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %w", s.op, ctxErr)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fail(s.op, 0, invalid("session closed"))
	}
	detail := "the WebSocket closed before the exit frame"
	if st := websocket.CloseStatus(err); st != -1 {
		detail += fmt.Sprintf(" (status %d)", int(st))
	} else {
		detail += ": " + s.red.Clean(httpcall.URLFree(err))
	}
	return fail(s.op, 0, &adapter.UnavailableError{Detail: detail, Uncertain: true}).WithCause(ErrNoExit)
}

// WriteStdin sends p to the command's stdin (stream 0 frames of at most
// 32 KiB; raw bytes in TTY mode). It returns adapter.ErrCommandExited once
// Recv has seen the exit, and *adapter.InvalidError when the session was
// started without Stdin or stdin was closed.
func (s *Session) WriteStdin(ctx context.Context, p []byte) error {
	if err := s.writable(); err != nil {
		return err
	}
	for len(p) > 0 {
		n := min(len(p), maxChunk)
		var msg []byte
		if s.tty {
			msg = p[:n]
		} else {
			msg = make([]byte, n+1)
			msg[0] = StreamStdin
			copy(msg[1:], p[:n])
		}
		if err := s.conn.Write(ctx, websocket.MessageBinary, msg); err != nil {
			return s.writeError(ctx, "write stdin", err)
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin sends the stdin EOF frame (stream 4), once; a second call
// returns nil. A TTY session has no EOF frame: *adapter.InvalidError (send
// the terminal's EOF character instead).
func (s *Session) CloseStdin(ctx context.Context) error {
	if s.tty {
		return fail(s.op, 0, invalid("a TTY session has no stdin EOF frame"))
	}
	s.mu.Lock()
	shut := s.stdinShut
	s.mu.Unlock()
	if shut {
		return nil
	}
	if err := s.writable(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.stdinShut {
		s.mu.Unlock()
		return nil
	}
	s.stdinShut = true
	s.mu.Unlock()
	if err := s.conn.Write(ctx, websocket.MessageBinary, []byte{StreamStdinEOF}); err != nil {
		return s.writeError(ctx, "close stdin", err)
	}
	return nil
}

func (s *Session) writable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.exited:
		return fail(s.op, 0, adapter.ErrCommandExited)
	case s.closed:
		return fail(s.op, 0, invalid("session closed"))
	case !s.stdin:
		return fail(s.op, 0, invalid("the session was started without stdin"))
	case s.stdinShut:
		return fail(s.op, 0, invalid("stdin is closed"))
	}
	return nil
}

// Resize sets a TTY session's terminal size (the resize message).
func (s *Session) Resize(ctx context.Context, rows, cols uint16) error {
	if !s.tty {
		return fail(s.op, 0, invalid("resize of a session without a TTY"))
	}
	if rows == 0 || cols == 0 {
		return fail(s.op, 0, invalid("zero terminal size"))
	}
	return s.control(ctx, "resize", controlMessage{Type: "resize", Rows: rows, Cols: cols})
}

// The signal names the signal message accepts (sprites-go exec.go).
var signals = map[string]bool{"INT": true, "TERM": true, "HUP": true, "KILL": true, "QUIT": true, "USR1": true, "USR2": true}

// Signal sends a signal ("TERM", "KILL", ...) to the command over the
// WebSocket. It needs the server's "signal" capability, else
// adapter.ErrNotSupported.
func (s *Session) Signal(ctx context.Context, sig string) error {
	if !signals[sig] {
		return fail(s.op, 0, invalid("unknown signal "+strconv.Quote(sig)))
	}
	if !s.caps["signal"] {
		return fail(s.op, 0, fmt.Errorf("signal over the WebSocket: %w", adapter.ErrNotSupported))
	}
	return s.control(ctx, "signal", controlMessage{Type: "signal", Signal: sig})
}

func (s *Session) control(ctx context.Context, what string, m controlMessage) error {
	s.mu.Lock()
	exited, closed := s.exited, s.closed
	s.mu.Unlock()
	if exited {
		return fail(s.op, 0, adapter.ErrCommandExited)
	}
	if closed {
		return fail(s.op, 0, invalid("session closed"))
	}
	b, _ := json.Marshal(m)
	if err := s.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return s.writeError(ctx, what, err)
	}
	return nil
}

func (s *Session) writeError(ctx context.Context, what string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("%s: %s: %w", s.op, what, ctxErr)
	}
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	if exited {
		return fail(s.op, 0, adapter.ErrCommandExited)
	}
	// Whether any byte arrived is unknown.
	return fail(s.op+": "+what, 0, &adapter.UnavailableError{Detail: s.red.Clean(httpcall.URLFree(err)), Uncertain: true})
}

// Close disconnects at once. It is idempotent and never waits for the
// server: Sprites holds an exec's socket about 5 s after the exit byte
// before it answers a close handshake (sprites-py #24 and #26, sprites-js
// #16), and the official SDKs never wait for that answer (sprites-go's
// wsCmd.Close writes its close frame and closes the connection). The
// connection is dropped without a close frame (coder/websocket cannot
// send one without waiting for the reply); to the server that is the
// same disconnect. A command still running goes on for its
// MaxRunAfterDisconnect.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.stopPing()
	// An error here means the peer was gone already: a disconnect either
	// way, so there is nothing to report.
	_ = s.conn.CloseNow()
	s.pinger.Wait()
	return nil
}

// Result is what Run collects.
type Result struct {
	Stdout, Stderr []byte
	ExitCode       int
	Info           SessionInfo
}

// maxRunOutput bounds what Run keeps of each stream.
const maxRunOutput = 64 << 20

// Run runs a command to its exit: it sends stdin (when not nil) and the EOF
// frame, collects stdout and stderr, and returns the exit code from the
// exit frame. A session that ends without an exit frame returns what was
// collected and an error wrapping [ErrNoExit]; never exit 0.
func (c *Client) Run(ctx context.Context, name string, opts ExecOptions, stdin []byte) (Result, error) {
	opts.Stdin = stdin != nil
	s, err := c.Exec(ctx, name, opts)
	if err != nil {
		return Result{}, err
	}
	defer s.Close()
	// The writer runs beside the reader so a command that writes before it
	// reads all its input cannot deadlock the two. Its errors are not
	// reported: the exit (or the read error) is the outcome, and a write
	// that failed racing the exit changes nothing.
	// A TTY has no EOF frame: its stdin is written and left open.
	var wg sync.WaitGroup
	if stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.WriteStdin(ctx, stdin) == nil && !opts.TTY {
				_ = s.CloseStdin(ctx)
			}
		}()
	}
	var r Result
	for {
		ev, err := s.Recv(ctx)
		if err != nil {
			s.Close() // unblocks the stdin writer
			wg.Wait()
			return r, err
		}
		switch ev.Kind {
		case EventStdout:
			if len(r.Stdout)+len(ev.Data) > maxRunOutput {
				s.Close()
				wg.Wait()
				return r, fail(s.op, 0, invalid("stdout exceeds the Run limit"))
			}
			r.Stdout = append(r.Stdout, ev.Data...)
		case EventStderr:
			if len(r.Stderr)+len(ev.Data) > maxRunOutput {
				s.Close()
				wg.Wait()
				return r, fail(s.op, 0, invalid("stderr exceeds the Run limit"))
			}
			r.Stderr = append(r.Stderr, ev.Data...)
		case EventInfo:
			r.Info = ev.Info
		case EventExit:
			r.ExitCode = ev.ExitCode
			s.Close()
			wg.Wait()
			return r, nil
		}
	}
}
