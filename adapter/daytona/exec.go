package daytona

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// sessionExec is guest.Executor over the toolbox's sessions.
//
// Each Exec is one toolbox session of its own (a session's shell runs one
// command at a time, and an attach runs for its lease): the argv, quoted
// by this package, goes into a script uploaded with the files API (so no
// text of the caller's ever passes through a command line Daytona splits
// or a shell reads from the session's input), and its stdin, when there is
// one, into a file the script redirects from (the toolbox's input is a
// JSON string with "\n" appended, echoed into the log, and never closed).
// The script runs argv with stderr discarded and then prints a trailer
// line with a per-call nonce and argv's exit status. Exec polls the
// command's log, forwards its complete lines as stdout, and returns the
// status from the trailer; deleting the session is how it stops the
// command when ctx ends, and how it frees the session's shell after.
//
// The log is fit for this only because what the script writes is text:
// runner-shim answers in JSON lines and, in text-safe mode, attaches as
// base64 lines, so the toolbox's mangling (NUL dropped, invalid UTF-8
// replaced, a newline added, markers removed) finds nothing to change. The
// trailer, not the toolbox's exitCode, ends a call: a log read before the
// daemon's line loops drained, or a command killed with the sandbox,
// cannot pass for a complete answer.
type sessionExec struct {
	a  *Adapter
	id string
	tb *Toolbox
}

var _ guest.Executor = (*sessionExec)(nil)

// sessionPrefix starts the id of every toolbox session the executor
// makes; the Unix time of its start follows, so a later adapter can
// delete what a driver that died mid-call left behind (sweep).
const sessionPrefix = "runner-"

// staleSession is the age past which an executor's session is a leftover:
// every call ends well before (an attach by its lease, a one-shot call
// by its lifetime).
const staleSession = 15 * time.Minute

// sweep deletes the executor sessions older than staleSession: idle
// shells left by a driver that died mid-call (the toolbox has no session
// timeout). Best effort: a failure only leaves them for the next sweep.
func (x *sessionExec) sweep(ctx context.Context, now time.Time) {
	l, err := x.tb.ListSessions(ctx)
	if err != nil {
		return
	}
	for _, s := range l {
		rest, ok := strings.CutPrefix(s.SessionID, sessionPrefix)
		if !ok {
			continue
		}
		ts, _, _ := strings.Cut(rest, "-")
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || now.Sub(time.Unix(sec, 0)) < staleSession {
			continue
		}
		x.tb.DeleteSession(ctx, s.SessionID)
	}
}

// maxStdin bounds an Exec's stdin (runner-shim write takes at most a few
// MiB per call).
const maxStdin = 64 << 20

// quote is s as one word of POSIX sh: single-quoted, each ' closed,
// escaped and reopened.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func nonce() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// script is the uploaded program of one call: it removes itself (and its
// stdin file once opened), runs argv with stderr dropped, and prints the
// trailer.
func script(argv []string, stdinPath, trailer string) []byte {
	var b strings.Builder
	b.WriteString("rm -f -- \"$0\"\nexec 2>/dev/null\n")
	if stdinPath != "" {
		fmt.Fprintf(&b, "exec <%s\nrm -f -- %s\n", quote(stdinPath), quote(stdinPath))
	} else {
		b.WriteString("exec </dev/null\n")
	}
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(a))
	}
	fmt.Fprintf(&b, "\nprintf '%%s %%d\\n' %s \"$?\"\n", quote(trailer))
	return []byte(b.String())
}

// Exec implements guest.Executor. lifetime is not needed: a command is
// stopped by deleting its session when ctx ends, and runner-shim's own
// lease bounds an attach whose driver died.
func (x *sessionExec) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, _ time.Duration) (int, error) {
	if len(argv) == 0 {
		return 0, &adapter.InvalidError{Detail: "exec: empty argv"}
	}
	n := nonce()
	dir := x.a.cfg.IODir
	scriptPath, stdinPath := dir+"/"+n+".sh", ""
	if stdin != nil {
		b, err := io.ReadAll(io.LimitReader(stdin, maxStdin+1))
		if err != nil {
			return 0, &adapter.InvalidError{Detail: "read stdin: " + err.Error()}
		}
		if len(b) > maxStdin {
			return 0, &adapter.InvalidError{Detail: fmt.Sprintf("stdin over %d bytes", maxStdin)}
		}
		stdinPath = dir + "/" + n + ".in"
		if err := x.tb.Upload(ctx, stdinPath, b); err != nil {
			return 0, x.confirm(ctx, err)
		}
	}
	trailer := "runner-exit-" + n
	if err := x.tb.Upload(ctx, scriptPath, script(argv, stdinPath, trailer)); err != nil {
		return 0, x.confirm(ctx, err)
	}
	sid := sessionPrefix + strconv.FormatInt(time.Now().Unix(), 10) + "-" + n
	if err := x.tb.CreateSession(ctx, sid); err != nil {
		return 0, x.confirm(ctx, err)
	}
	// Deleting the session ends its shell and the command if it still
	// runs (ctx ended): the toolbox's only kill.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		x.tb.DeleteSession(dctx, sid)
		cancel()
	}()
	r, err := x.tb.Exec(ctx, sid, "sh "+scriptPath, true)
	if err != nil {
		return 0, x.confirm(ctx, err)
	}
	return x.follow(ctx, sid, r.CmdID, trailer, stdout)
}

// follow polls the command's log until its trailer: complete lines before
// it are copied to stdout as they appear.
func (x *sessionExec) follow(ctx context.Context, sid, cid, trailer string, stdout io.Writer) (int, error) {
	var off int
	mark := []byte(trailer + " ")
	wait := x.a.cfg.PollInterval
	exited := false
	for {
		log, err := x.tb.Logs(ctx, sid, cid, false)
		if err != nil {
			return 0, x.confirm(ctx, err)
		}
		if len(log) < off {
			return 0, &adapter.UnavailableError{Detail: fmt.Sprintf("toolbox: the log of %s shrank", cid)}
		}
		progress := false
		if end := bytes.LastIndexByte(log[off:], '\n'); end >= 0 {
			progress = true
			chunk := log[off : off+end+1]
			off += end + 1
			if i := bytes.Index(chunk, mark); i >= 0 {
				// The trailer follows argv's last byte; a line of its own
				// when argv's output ended with a newline.
				rest, _, _ := bytes.Cut(chunk[i+len(mark):], []byte("\n"))
				status, err := strconv.Atoi(string(rest))
				if err != nil {
					return 0, &adapter.UnavailableError{Detail: fmt.Sprintf("toolbox: malformed trailer %q", rest)}
				}
				if _, err := stdout.Write(chunk[:i]); err != nil {
					return 0, fmt.Errorf("copy stdout: %w", context.Canceled)
				}
				return status, nil
			}
			if _, err := stdout.Write(chunk); err != nil {
				return 0, fmt.Errorf("copy stdout: %w", context.Canceled)
			}
		}
		if exited && !progress {
			// Ended, its log read after its end, and no trailer: the
			// script was killed (the sandbox stopped) or its log lost.
			return 0, &adapter.UnavailableError{Detail: fmt.Sprintf("toolbox: command %s ended without its trailer", cid)}
		}
		if progress {
			wait = x.a.cfg.PollInterval
		} else {
			c, err := x.tb.Command(ctx, sid, cid)
			if err != nil {
				return 0, x.confirm(ctx, err)
			}
			// One more read of the log after the end, then judge.
			exited = c.ExitCode != nil
			wait = min(wait*2, 8*x.a.cfg.PollInterval)
			if exited {
				wait = 0
			}
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return 0, fmt.Errorf("exec: %w", ctx.Err())
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return 0, fmt.Errorf("exec: %w", ctx.Err())
		}
	}
}

// confirm judges a toolbox failure: one that proves nothing is checked
// with a GET of the sandbox, whose 404 is the only not_found and whose
// stopped state makes it invalid (suspended). Anything else stays what it
// was.
func (x *sessionExec) confirm(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if errors.Is(err, ctx.Err()) {
			return err
		}
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	if !errors.Is(err, adapter.ErrUnavailable) && !errors.Is(err, adapter.ErrProvider) {
		return err
	}
	sb, gerr := x.a.cfg.Client.Get(ctx, x.id)
	switch {
	case errors.Is(gerr, adapter.ErrNotFound):
		x.a.forget(x.id)
		return fmt.Errorf("sandbox %s: %w", x.id, adapter.ErrNotFound)
	case gerr == nil && gone(sb.State):
		x.a.forget(x.id)
		return fmt.Errorf("sandbox %s is %s: %w", x.id, sb.State, adapter.ErrNotFound)
	case gerr == nil && sb.State != StateStarted:
		return &adapter.InvalidError{Detail: fmt.Sprintf("sandbox %s is %s", x.id, sb.State)}
	}
	return err
}

// install uploads the runner-shim binary to the configured path and makes
// it executable with chmod through /process/execute (the upload sets no
// mode).
func (x *sessionExec) install(ctx context.Context) error {
	b, err := x.a.cfg.ShimBinary()
	if err != nil {
		return fmt.Errorf("read runner-shim binary: %w", err)
	}
	if err := x.tb.Upload(ctx, x.a.cfg.Shim, b); err != nil {
		return x.confirm(ctx, err)
	}
	// Shim is a plain path (NewAdapter): safe in the split command line.
	r, err := x.tb.Execute(ctx, ExecuteRequest{Command: "chmod 0755 " + x.a.cfg.Shim, Timeout: 60})
	if err != nil {
		return x.confirm(ctx, err)
	}
	if r.ExitCode != 0 {
		return &adapter.ProviderError{Provider: provider, Detail: fmt.Sprintf("chmod runner-shim in the guest: exit status %d", r.ExitCode)}
	}
	return nil
}
