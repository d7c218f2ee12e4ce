package sprites

// Exec over the WebSocket: the binary frame protocol, ExecOptions and their
// query, Exec (which opens a Session, execsession.go) and Run.

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

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
