package daytona

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"
)

// StdoutMarker and StderrMarker prefix every line of a session command's
// log, by stream (daemon pkg/session types.go). They are not escaped: the
// same bytes inside a payload are indistinguishable from a marker.
var (
	StdoutMarker = []byte{1, 1, 1}
	StderrMarker = []byte{2, 2, 2}
)

// SplitOutputHeader asks the daemon for a log with its stream markers
// kept; without it (and without an SDK version header) the daemon removes
// every marker byte sequence, payload ones included.
const SplitOutputHeader = "X-Daytona-Split-Output"

// Toolbox calls one sandbox's toolbox daemon through the toolbox proxy.
// It is safe for concurrent use and holds no goroutines.
type Toolbox struct {
	c         *Client
	base      string
	sandboxID string
}

// String names the toolbox without the key.
func (t *Toolbox) String() string { return "daytona.Toolbox{" + t.base + "}" }

// GoString is String.
func (t *Toolbox) GoString() string { return t.String() }

// ExecuteRequest is the body of POST /process/execute.
type ExecuteRequest struct {
	// Command is a shell script: the daemon feeds it to the sandbox's
	// shell (zsh or bash, as /etc/shells lists them) on its stdin, so a
	// missing program is the shell's exit 127 and message.
	Command string `json:"command"`
	// Cwd is the working directory; empty: the sandbox's.
	Cwd string `json:"cwd,omitempty"`
	// Envs adds to the process environment.
	Envs map[string]string `json:"envs,omitempty"`
	// Timeout in seconds; 0: none (the daemon has no default). Past it
	// the process group is killed and the call fails (408, kind
	// unavailable).
	Timeout int `json:"timeout,omitempty"`
}

// ExecuteResponse is what POST /process/execute answers.
type ExecuteResponse struct {
	ExitCode int `json:"exitCode"`
	// Result is stdout and stderr merged into one string, in the order the
	// pipe delivered them; invalid UTF-8 comes back as U+FFFD.
	Result string `json:"result"`
}

// Execute runs a command to its end and returns its merged output:
// POST /process/execute. A shell that cannot start (a missing Cwd) gives
// ExitCode -1 and Go's error as the Result.
func (t *Toolbox) Execute(ctx context.Context, req ExecuteRequest) (ExecuteResponse, error) {
	var r ExecuteResponse
	err := t.c.do(ctx, "toolbox execute", opToolbox, http.MethodPost, t.base+"/process/execute", nil, req, &r)
	return r, err
}

// CreateSession starts a session (a shell in the sandbox that runs the
// commands given to it, one after another, each sourced in the shell
// itself): POST /process/session. Any non-empty id is accepted, dots
// included. A taken id gives an error for which IsSessionExists is true.
func (t *Toolbox) CreateSession(ctx context.Context, sessionID string) error {
	body := map[string]string{"sessionId": sessionID}
	return t.c.do(ctx, "toolbox create session "+sessionID, opToolbox, http.MethodPost, t.base+"/process/session", nil, body, nil)
}

// DeleteSession ends a session and its shell: DELETE
// /process/session/{id}. It is the only way to stop a command. The daemon
// answers only once the session's processes are gone: SIGTERM to the
// shell's process group and every descendant, a check every 100 ms, and
// SIGKILL after 5 s, so a call costs 100 ms at least and 5 s when
// something ignores SIGTERM.
func (t *Toolbox) DeleteSession(ctx context.Context, sessionID string) error {
	return t.c.do(ctx, "toolbox delete session "+sessionID, opToolbox, http.MethodDelete, t.sessionURL(sessionID), nil, nil, nil)
}

// ListSessions returns every session of the sandbox: GET /process/session.
func (t *Toolbox) ListSessions(ctx context.Context) ([]Session, error) {
	var l []Session
	err := t.c.do(ctx, "toolbox list sessions", opToolbox, http.MethodGet, t.base+"/process/session", nil, nil, &l)
	return l, err
}

// Command is a session command's record (schema Command).
type Command struct {
	ID      string `json:"id"`
	Command string `json:"command"`
	// ExitCode is nil while the command runs.
	ExitCode *int `json:"exitCode,omitempty"`
}

// Session is a session's record (schema Session).
type Session struct {
	SessionID string     `json:"sessionId"`
	Commands  []*Command `json:"commands"`
}

// GetSession returns a session and its commands: GET /process/session/{id}.
func (t *Toolbox) GetSession(ctx context.Context, sessionID string) (Session, error) {
	var s Session
	err := t.c.do(ctx, "toolbox get session "+sessionID, opToolbox, http.MethodGet, t.sessionURL(sessionID), nil, nil, &s)
	return s, err
}

// ExecResult is what an exec answers: the command id and, for a
// synchronous exec, the merged output and the exit code.
type ExecResult struct {
	CmdID    string  `json:"cmdId"`
	Output   *string `json:"output,omitempty"`
	ExitCode *int    `json:"exitCode,omitempty"`
}

// Exec runs command (a shell script) in the session: POST
// /process/session/{id}/exec {command, runAsync}. With async it answers
// {cmdId} at once; otherwise when the command ends. The command is
// sourced in the session's own shell: its cd and variables stay for the
// next command, and its `exit` ends the session (no exit code is ever
// recorded for it, and the next exec fails). The session's shell runs one
// command at a time: a second exec waits behind a running one, so a
// long-lived command wants a session of its own. Each async command
// leaves a `sleep 3600` (its stdin holder) in the session until the
// session is deleted.
func (t *Toolbox) Exec(ctx context.Context, sessionID, command string, async bool) (ExecResult, error) {
	body := map[string]any{"command": command, "runAsync": async}
	var r ExecResult
	err := t.c.do(ctx, "toolbox exec in session "+sessionID, opToolbox, http.MethodPost, t.sessionURL(sessionID)+"/exec", nil, body, &r)
	if err == nil && r.CmdID == "" {
		err = fail("toolbox exec in session "+sessionID, http.StatusOK, unavailable("answer has no cmdId"))
	}
	return r, err
}

// commandReads bounds the reads of a command record by Command, and
// commandBackoff is the wait before the second (doubling after).
const (
	commandReads   = 6
	commandBackoff = 10 * time.Millisecond
)

// Command returns a command's record: GET /process/session/{id}/command/{cid}.
//
// The daemon appends the exit code to its file with `>>` once the command
// ended, so for a moment the file is there and empty, and the read
// answers 500 "failed to convert exit code to int". The read is
// idempotent, so an answer of the daemon's that is a 500 of its own (not
// a wrapped typed error) is read again, up to commandReads times with a
// doubling backoff (about 300 ms in all); the last error is returned, in
// its kind (provider), when every read failed.
func (t *Toolbox) Command(ctx context.Context, sessionID, cmdID string) (Command, error) {
	wait := commandBackoff
	for n := 1; ; n++ {
		var c Command
		err := t.c.do(ctx, "toolbox get command "+cmdID, opToolbox, http.MethodGet, t.commandURL(sessionID, cmdID), nil, nil, &c)
		var e *Error
		if err == nil || n == commandReads || !errors.As(err, &e) || e.OwnStatus != http.StatusInternalServerError {
			if err != nil && n > 1 {
				err = fmt.Errorf("%w (after %d reads)", err, n)
			}
			return c, err
		}
		tm := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			tm.Stop()
			return Command{}, fmt.Errorf("toolbox get command %s: %w", cmdID, ctx.Err())
		case <-tm.C:
		}
		wait *= 2
	}
}

// Logs returns a command's whole log so far: GET
// /process/session/{id}/command/{cid}/logs. The daemon has no offset, so
// a poller re-reads it and keeps its own position. With split the stream
// markers are kept ([StdoutMarker], [StderrMarker] at the start of every
// line); without, every marker sequence is removed, payload ones too. In
// both, NUL bytes are gone, a final newline was added, and input sent to
// the command appears as stdout; invalid UTF-8 comes back as it was (the
// log is plain text: no X-Daytona-SDK-Version header is sent, which would
// make a daemon from SDK 0.167.0 answer JSON, with U+FFFD).
func (t *Toolbox) Logs(ctx context.Context, sessionID, cmdID string, split bool) ([]byte, error) {
	h := http.Header{}
	if split {
		h.Set(SplitOutputHeader, "true")
	}
	raw, err := t.c.send(ctx, "toolbox get logs of "+cmdID, opToolbox, http.MethodGet, t.commandURL(sessionID, cmdID)+"/logs", nil, nil, "", h)
	return raw, err
}

// SendInput writes data to a running command's stdin: POST
// /process/session/{id}/command/{cid}/input {data}. The daemon appends
// "\n" unless data ends with one, and echoes data into the log as stdout.
// Its write blocks, with no deadline, until the command reads: bound the
// call with ctx.
// data is a JSON string: invalid UTF-8 is refused here, not mangled.
// A command that has completed gives adapter.ErrCommandExited.
func (t *Toolbox) SendInput(ctx context.Context, sessionID, cmdID, data string) error {
	opName := "toolbox send input to " + cmdID
	if !utf8.ValidString(data) {
		return fail(opName, 0, invalid("input is not valid UTF-8"))
	}
	body := map[string]string{"data": data}
	return t.c.do(ctx, opName, opToolbox, http.MethodPost, t.commandURL(sessionID, cmdID)+"/input", nil, body, nil)
}

// Upload writes a file in the sandbox: POST /files/upload?path= with a
// multipart form (field "file"). Missing parent directories are created
// 0750; the file's mode is the daemon's default (0644 under the usual
// umask, not executable). A failure is the daemon's bare 400: kind
// invalid.
func (t *Toolbox) Upload(ctx context.Context, path string, data []byte) error {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, err := mw.CreateFormFile("file", "file")
	if err == nil {
		_, err = fw.Write(data)
	}
	if err == nil {
		err = mw.Close()
	}
	if err != nil {
		return fail("toolbox upload "+path, 0, invalid("encode form: "+err.Error()))
	}
	_, err = t.c.send(ctx, "toolbox upload "+path, opToolboxFile, http.MethodPost, t.base+"/files/upload", url.Values{"path": {path}}, &buf, mw.FormDataContentType(), nil)
	return err
}

// Download reads a file from the sandbox: GET /files/download?path=. A
// missing file is kind invalid, with IsToolboxNotFound true.
func (t *Toolbox) Download(ctx context.Context, path string) ([]byte, error) {
	raw, err := t.c.send(ctx, "toolbox download "+path, opToolboxFile, http.MethodGet, t.base+"/files/download", url.Values{"path": {path}}, nil, "", nil)
	return raw, err
}

func (t *Toolbox) sessionURL(sessionID string) string {
	return t.base + "/process/session/" + url.PathEscape(sessionID)
}

func (t *Toolbox) commandURL(sessionID, cmdID string) string {
	return t.sessionURL(sessionID) + "/command/" + url.PathEscape(cmdID)
}
