package daytonatest

// The toolbox's command endpoints: a session command run as the daemon
// runs it (its wrapper sourced in the session's shell, FIFOs, the exit
// code appended last), getting a command, and writing its input.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// wrapper is what the session shell is fed for one command, written from
// the daemon's behaviour (pkg/session execute.go): FIFOs for the
// command's stdout, stderr and stdin; a line-reading loop per output
// stream that prefixes each line with its marker and appends it to the
// log; a stdin holder (async: a loop of `sleep 3600` writing to the stdin
// FIFO, whose sleep outlives the loop's kill and stays until the session
// goes; sync: an immediate EOF); the command file SOURCED in the session's
// own shell, so `exit` ends the session and cd and variables carry over;
// then, once both loops drained, the exit code APPENDED to its file with
// `>>` (which creates it empty first). A trap removes the FIFOs on exit.
// The placeholders are replaced.
const wrapper = `{
_d=@DIR@
_o="$_d/stdout.pipe"; _e="$_d/stderr.pipe"; _i=@INPUT@
rm -f "$_o" "$_e" "$_i" && mkfifo "$_o" "$_e" "$_i" || exit 1
trap 'rm -f "$_o" "$_e" "$_i"' EXIT HUP INT TERM
( while IFS= read -r l || [ -n "$l" ]; do printf '\001\001\001%s\n' "$l"; done < "$_o" ) >> @LOG@ & _r1=$!
( while IFS= read -r l || [ -n "$l" ]; do printf '\002\002\002%s\n' "$l"; done < "$_e" ) >> @LOG@ & _r2=$!
@HOLDER@
_h=$!
{ . @CMDFILE@; } < "$_i" > "$_o" 2> "$_e"
_c=$?
kill "$_h" 2>/dev/null; wait "$_h" 2>/dev/null
wait "$_r1" "$_r2"
echo "$_c" >> @EXIT@
rm -f "$_o" "$_e" "$_i"
}
`

// shellQuote is s as one double-quoted shell word (the daemon uses Go's
// %q, which the shell reads the same for these plain paths).
func shellQuote(s string) string { return strconv.Quote(s) }

func (s *Server) exec(w http.ResponseWriter, r *http.Request, sb *sandbox, sid string) {
	var req struct {
		Command  string `json:"command"`
		RunAsync bool   `json:"runAsync"`
		Async    bool   `json:"async"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || strings.TrimSpace(req.Command) == "" {
		// The handler's AbortWithError: a status and no body.
		abort(w, http.StatusBadRequest)
		return
	}
	async := req.RunAsync || req.Async
	format := logFormat(r.Header)
	s.mu.Lock()
	ss, ok := sb.sessions[sid]
	if !ok {
		s.mu.Unlock()
		// The service's NotFoundError, wrapped by the handler: a 500.
		defaultError(w, "failed to execute command: not found: session not found")
		return
	}
	c := &command{id: randUUID(), text: req.Command}
	c.dir = filepath.Join(ss.dir, c.id)
	fail := func(msg string, err error) {
		s.mu.Unlock()
		defaultError(w, "failed to execute command: bad request: "+msg+": "+err.Error())
	}
	ss.cmds[c.id] = c
	ss.order = append(ss.order, c.id)
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		fail("failed to create log directory", err)
		return
	}
	logPath := filepath.Join(c.dir, "output.log")
	if err := os.WriteFile(logPath, nil, 0o666); err != nil {
		fail("failed to create log file", err)
		return
	}
	cmdFile := filepath.Join(c.dir, "cmd.sh")
	if err := os.WriteFile(cmdFile, []byte(req.Command), 0o600); err != nil {
		fail("failed to write command file", err)
		return
	}
	holder := `cat /dev/null > "$_i" &`
	if async {
		holder = `while :; do sleep 3600; done > "$_i" &`
	}
	script := strings.NewReplacer("@DIR@", shellQuote(c.dir), "@INPUT@", shellQuote(filepath.Join(c.dir, "input.pipe")),
		"@LOG@", shellQuote(logPath), "@HOLDER@", holder, "@CMDFILE@", shellQuote(cmdFile),
		"@EXIT@", shellQuote(filepath.Join(c.dir, "exit_code"))).Replace(wrapper)
	if _, err := io.WriteString(ss.stdin, script); err != nil {
		// A shell that exited (`exit` in an earlier command, a kill):
		// its stdin pipe is broken.
		fail("failed to write command", err)
		return
	}
	deleted := ss.deleted
	s.mu.Unlock()
	if async {
		writeJSON(w, http.StatusAccepted, map[string]any{"cmdId": c.id, "output": nil, "stdout": nil, "stderr": nil, "exitCode": nil})
		return
	}
	// Synchronous: poll the exit code file every 50 ms, for ever (a shell
	// that died never writes it) unless the session is deleted.
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		ec, err := c.readExitCode()
		s.mu.Unlock()
		if err != nil {
			defaultError(w, "failed to execute command: bad request: "+err.Error())
			return
		}
		if ec != nil {
			b, _ := os.ReadFile(logPath)
			out := map[string]any{"cmdId": c.id, "output": nil, "stdout": nil, "stderr": nil, "exitCode": *ec}
			switch format {
			case formatCombined:
				out["output"] = string(stripMarkers(b))
			case formatJSON:
				o, e := demux(b)
				out["output"], out["stdout"], out["stderr"] = string(b), string(o), string(e)
			default:
				out["output"] = string(b)
			}
			writeJSON(w, http.StatusOK, out)
			return
		}
		select {
		case <-deleted:
			defaultError(w, "failed to execute command: bad request: session cancelled")
			return
		case <-r.Context().Done():
			return
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lookupCommand returns a command; the caller holds s.mu.
func lookupCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) (*session, *command, bool) {
	ss, ok := lookupSession(w, r, sb, sid)
	if !ok {
		return nil, nil, false
	}
	c, ok := ss.cmds[cid]
	if !ok {
		typedError(w, r, http.StatusNotFound, "not found: command not found")
	}
	return ss, c, ok
}

func (s *Server) getCommand(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, c, ok := lookupCommand(w, r, sb, sid, cid)
	if !ok {
		return
	}
	m, err := s.record(c)
	if err != nil {
		defaultError(w, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) input(w http.ResponseWriter, r *http.Request, sb *sandbox, sid, cid string) {
	var req struct {
		Data string `json:"data"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Data == "" {
		typedError(w, r, http.StatusBadRequest, "invalid body request: Key: 'SessionSendInputRequest.Data' Error:Field validation for 'Data' failed on the 'required' tag")
		return
	}
	s.mu.Lock()
	_, c, ok := lookupCommand(w, r, sb, sid, cid)
	var ec *int
	if ok {
		ec = c.exitCode
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	// Only an exit code the daemon has already read makes it 410.
	if ec != nil {
		typedError(w, r, http.StatusGone, "gone: command has already completed with exit code "+strconv.Itoa(*ec))
		return
	}
	data := req.Data
	if !strings.HasSuffix(data, "\n") {
		data += "\n"
	}
	// A blocking open and write, with no deadline, as the daemon's: the
	// open waits for the command to open its stdin, the write for room in
	// the pipe. Only the stand-in's shutdown releases them.
	pipe := filepath.Join(c.dir, "input.pipe")
	if err := s.writeFIFO(pipe, data); err != nil {
		typedError(w, r, http.StatusInternalServerError, "internal server error: "+err.Error())
		return
	}
	// The daemon echoes the input into the log as stdout.
	if lf, err := os.OpenFile(filepath.Join(c.dir, "output.log"), os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
		_, _ = lf.Write(append(append([]byte{}, stdoutMarker...), data...))
		lf.Close()
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeFIFO opens path for writing, blocking, and writes data. The stand-in's
// shutdown unblocks a waiting open by opening the FIFO's read side itself
// (the killed command no longer will); the goroutine doing so is this
// call's, and the call waits for it.
func (s *Server) writeFIFO(path, data string) error {
	done := make(chan struct{})
	released := make(chan struct{})
	go func() {
		defer close(released)
		select {
		case <-done:
		case <-s.ctx.Done():
			if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
		}
	}()
	defer func() { close(done); <-released }()
	f, err := os.OpenFile(path, os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("failed to open input pipe: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		return fmt.Errorf("failed to write to input pipe: %w", err)
	}
	return nil
}
