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
	"sync"
	"time"

	"github.com/agentrunner/runner/adapter"
	"github.com/agentrunner/runner/adapter/guest"
)

// sessionExec is guest.Executor over the toolbox's sessions.
//
// Each Exec runs in a toolbox session of its own while it lasts (a
// session's shell runs one command at a time, and an attach runs for its
// lease): the argv, quoted by this package, goes into a script uploaded
// with the files API (so no text of the caller's ever passes through a
// command line a shell reads from the session's input),
// and its stdin, when there is one, into a file the script redirects from
// (the toolbox's input is a JSON string with "\n" appended, echoed into
// the log, and never closed). The session's shell runs `sh script` (a
// child shell: the script's exit, cd or variables never touch the
// session's shell), which runs argv with stderr discarded and then prints
// a trailer line with a per-call nonce and argv's exit status. Exec polls
// the command's log, forwards its complete lines as stdout, and returns
// the status from the trailer.
//
// Sessions are reused: a call that ended with its trailer gives its
// session back to a small pool of idle ones, because deleting a session
// costs the daemon's termination poll (100 ms at least, 5 s when
// something ignores SIGTERM) and creating one a request. A session is
// retired (deleted) after sessionMaxUses calls (each async command leaves
// a `sleep 3600` stdin holder in it until it goes) or sessionMaxAge (so a
// sweep by another driver never meets a session in use), and whenever its
// call did not end cleanly: deleting the session is how a command is
// stopped when ctx ends, or after the call's lifetime. Deletes run in
// goroutines this executor owns, each bounded by deleteTimeout; Close
// deletes the idle sessions and waits for every delete.
//
// The log is fit for this only because what the script writes is text:
// runner-shim answers in JSON lines and, in text-safe mode, attaches as
// base64 lines, so the toolbox's mangling (NUL dropped, a newline added,
// markers removed) finds nothing to change. The trailer, not the
// toolbox's exitCode, ends a call: a log read before the daemon's line
// loops drained, or a command killed with the sandbox, cannot pass for a
// complete answer.
type sessionExec struct {
	a  *Adapter
	id string
	tb *Toolbox
	// perCall, when set, makes every call create its own session and
	// delete it on the call's path (the cost the pool removes; the
	// benchmark's baseline).
	perCall bool

	mu     sync.Mutex // guards idle and closed, and orders wg.Add before Close's Wait
	idle   []*toolSession
	closed bool
	wg     sync.WaitGroup // asynchronous session deletes
}

var _ guest.Executor = (*sessionExec)(nil)

// toolSession is one toolbox session of the executor's.
type toolSession struct {
	id   string
	born time.Time
	uses int
}

// The pool's bounds.
const (
	// maxIdle is how many idle sessions a sandbox keeps.
	maxIdle = 4
	// sessionMaxUses retires a session after that many calls: each one
	// leaves a sleep process in it until the session is deleted.
	sessionMaxUses = 64
	// sessionMaxAge retires a session that old, well before staleSession,
	// so that a sweep never deletes a session while a call uses it (the
	// longest call lasts its lifetime plus noStatusMargin).
	sessionMaxAge = 5 * time.Minute
	// deleteTimeout bounds one session DELETE (the daemon answers within
	// its 5 s SIGKILL escalation plus a check).
	deleteTimeout = 10 * time.Second
	// noStatusMargin is how long past a call's lifetime the executor
	// still waits for the trailer before it gives the status up.
	noStatusMargin = 3 * time.Second
)

// take returns an idle session (reused true) or creates one.
func (x *sessionExec) take(ctx context.Context, now time.Time) (*toolSession, bool, error) {
	x.mu.Lock()
	for !x.perCall && len(x.idle) > 0 {
		ss := x.idle[len(x.idle)-1]
		x.idle = x.idle[:len(x.idle)-1]
		if now.Sub(ss.born) < sessionMaxAge {
			x.mu.Unlock()
			return ss, true, nil
		}
		x.discardLocked(ss)
	}
	x.mu.Unlock()
	ss := &toolSession{id: sessionPrefix + strconv.FormatInt(now.Unix(), 10) + "-" + nonce(), born: now}
	if err := x.tb.CreateSession(ctx, ss.id); err != nil {
		return nil, false, err
	}
	return ss, false, nil
}

// release gives back the session of a call that ended with its trailer.
func (x *sessionExec) release(ss *toolSession) {
	ss.uses++
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.perCall || x.closed || ss.uses >= sessionMaxUses || time.Since(ss.born) >= sessionMaxAge || len(x.idle) >= maxIdle {
		x.discardLocked(ss)
		return
	}
	x.idle = append(x.idle, ss)
}

// discard deletes a session: in a goroutine of the executor's, or on the
// caller's path when the executor is per-call or closed.
func (x *sessionExec) discard(ss *toolSession) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.discardLocked(ss)
}

func (x *sessionExec) discardLocked(ss *toolSession) {
	del := func() {
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		defer cancel()
		x.tb.DeleteSession(ctx, ss.id)
	}
	if x.perCall || x.closed {
		x.mu.Unlock()
		del()
		x.mu.Lock()
		return
	}
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		del()
	}()
}

// Close deletes the idle sessions and waits for every delete under way.
// It is idempotent; a call still running after it deletes its own session
// on its path.
func (x *sessionExec) Close() {
	x.mu.Lock()
	idle := x.idle
	x.idle = nil
	for _, ss := range idle {
		x.discardLocked(ss)
	}
	x.closed = true
	x.mu.Unlock()
	x.wg.Wait()
}

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

// Exec implements guest.Executor. A command is stopped by deleting its
// session when ctx ends or when lifetime (plus noStatusMargin) passed
// without its trailer; then the error wraps guest.ErrNoStatus.
func (x *sessionExec) Exec(ctx context.Context, argv []string, stdin io.Reader, stdout io.Writer, lifetime time.Duration) (int, error) {
	if len(argv) == 0 {
		return 0, &adapter.InvalidError{Detail: "exec: empty argv"}
	}
	n := nonce()
	dir := x.a.cfg.IODir
	scriptPath, stdinPath := dir+"/"+n+".sh", ""
	if stdin != nil {
		b, err := guest.ReadStdin(stdin, maxStdin)
		if err != nil {
			return 0, err
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
	for {
		ss, reused, err := x.take(ctx, time.Now())
		if err != nil {
			return 0, x.confirm(ctx, err)
		}
		r, err := x.tb.Exec(ctx, ss.id, "sh "+scriptPath, true)
		if err != nil {
			x.discard(ss)
			if reused && isDaemonAnswer(err) && ctx.Err() == nil {
				// The daemon refused the exec before running anything
				// (an idle session whose shell died answers "broken
				// pipe", one the daemon lost "not found"): a fresh
				// session runs the script, which is still there.
				continue
			}
			return 0, x.confirm(ctx, err)
		}
		status, err := x.follow(ctx, ss.id, r.CmdID, trailer, stdout, lifetime)
		if err != nil {
			x.discard(ss)
			return 0, err
		}
		x.release(ss)
		return status, nil
	}
}

// follow polls the command's log until its trailer: complete lines before
// it are copied to stdout as they appear.
//
// With lifetime positive, a call that has no trailer by lifetime plus
// noStatusMargin is given up: a session shell killed (by the OOM killer)
// with its command never records an exit code, and its log stops growing,
// so without a bound the poll would last as long as ctx. What arrived is
// in stdout; the error is unavailable and wraps guest.ErrNoStatus, so a
// complete runner-shim answer in stdout still decides the call.
func (x *sessionExec) follow(ctx context.Context, sid, cid, trailer string, stdout io.Writer, lifetime time.Duration) (int, error) {
	var giveUp time.Time
	if lifetime > 0 {
		giveUp = time.Now().Add(lifetime + noStatusMargin)
	}
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
			return 0, noStatus("toolbox: command %s ended without its trailer", cid)
		}
		if !giveUp.IsZero() && time.Now().After(giveUp) {
			return 0, noStatus("toolbox: command %s of session %s gave no trailer and no exit code within its lifetime %s (its session's shell may have died)", cid, sid, lifetime)
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

// noStatus is the error of a call whose exit status is unknown: retryable
// (unavailable) and guest.ErrNoStatus, never an invented status.
func noStatus(format string, args ...any) error {
	return fmt.Errorf("%w: %w", &adapter.UnavailableError{Detail: fmt.Sprintf(format, args...)}, guest.ErrNoStatus)
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
	// Shim is a plain path (NewAdapter): safe in the shell's command line.
	r, err := x.tb.Execute(ctx, ExecuteRequest{Command: "chmod 0755 " + x.a.cfg.Shim, Timeout: 60})
	if err != nil {
		return x.confirm(ctx, err)
	}
	if r.ExitCode != 0 {
		return &adapter.ProviderError{Provider: provider, Detail: fmt.Sprintf("chmod runner-shim in the guest: exit status %d", r.ExitCode)}
	}
	return nil
}
