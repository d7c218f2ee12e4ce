package sprites

// A running exec Session: its receive loop and frame decoding, stdin,
// resize and signals as control messages, keepalive pings, Close.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/hosted/httpcall"
	"github.com/coder/websocket"
)

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
